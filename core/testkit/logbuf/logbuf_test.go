package logbuf

import (
	"strings"
	"sync"
	"testing"
	"time"
)

func TestWaitSeesLaterWrite(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 100 {
			b.Write([]byte(strings.Repeat("x", i%7) + "\n"))
		}
		b.Write([]byte("ready\n"))
	}()
	if err := b.Wait("ready", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if !strings.HasSuffix(b.String(), "ready\n") {
		t.Fatalf("text: %q", b.String())
	}
}

func TestWaitFailsWhenTheLineNeverComes(t *testing.T) {
	var b Buffer
	b.Write([]byte("something else\n"))
	err := b.Wait("listening", 20*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "something else") {
		t.Fatalf("want a timeout error carrying the output, got %v", err)
	}
}
