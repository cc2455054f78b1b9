package redisserver

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestStandaloneKillRestart(t *testing.T) {
	s := Start(t, Options{Password: "pw"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.Do(ctx, "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Do(ctx, "GET", "k"); err != nil || v != "v" {
		t.Fatalf("GET k = %q, %v", v, err)
	}
	if _, err := Do(ctx, s.Addr, "", "GET", "k"); err == nil {
		t.Fatal("GET without the password succeeded")
	}
	port := s.Port
	s.Kill()
	if _, err := s.Do(ctx, "PING"); err == nil {
		t.Fatal("killed server still answers")
	}
	s.Restart()
	if s.Port != port {
		t.Fatalf("restart moved the port %d -> %d", port, s.Port)
	}
	if v, err := s.Do(ctx, "GET", "k"); err != nil || v != "" {
		t.Fatalf("restarted server: GET k = %q, %v; want empty (no persistence)", v, err)
	}
}

func TestCluster(t *testing.T) {
	c := StartCluster(t, 3)
	if len(c.Addrs()) != 3 {
		t.Fatalf("addrs %v", c.Addrs())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	slots, err := c.Nodes[0].Do(ctx, "CLUSTER", "INFO")
	if err != nil {
		t.Fatal(err)
	}
	if want := "cluster_slots_assigned:16384"; !strings.Contains(slots, want) {
		t.Fatalf("cluster info lacks %q:\n%s", want, slots)
	}
}

// A goroutine that locks its thread and ends (as the tier's writers do)
// ends the thread; that may not kill a server started from that thread (its
// parent-death signal follows the starting thread, not the process).
func TestServerOutlivesItsStartingThread(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	started := make(chan *Server)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		started <- Start(t, Options{})
	}()
	s := <-started
	time.Sleep(200 * time.Millisecond) // the thread's end and a signal take a moment
	if v, err := s.Do(ctx, "PING"); err != nil || v != "PONG" {
		t.Fatalf("server after its starting thread ended: %q, %v\n%s", v, err, s.Log())
	}
}
