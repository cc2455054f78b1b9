package fs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"

	"kvdock/transfer/tier"
)

// TestHostileFSFileOfAnotherLengthIsNotServed: a chunk file rewritten behind
// the index with other bytes and another length is a miss, forgotten by
// the index and removed, on every read path: none serves the file's first indexed
// bytes as if they were the value stored under the key.
func TestHostileFSFileOfAnotherLengthIsNotServed(t *testing.T) {
	ctx := context.Background()
	value := bytes.Repeat([]byte{0xA5}, 8192)
	reads := map[string]func(tr *Tier, key string) ([]byte, error){
		"Get": func(tr *Tier, key string) ([]byte, error) { return tr.Get(ctx, key) },
		"GetInto": func(tr *Tier, key string) ([]byte, error) {
			head, payload := make([]byte, 64), make([]byte, len(value)-64)
			err := tr.GetInto(ctx, key, head, payload, nil)
			return append(head, payload...), err
		},
		"GetHead": func(tr *Tier, key string) ([]byte, error) {
			buf := make([]byte, len(value))
			n, _, err := tr.GetHead(ctx, key, buf)
			return buf[:n], err
		},
	}
	for name, read := range reads {
		t.Run(name, func(t *testing.T) {
			tr := openTier(t, t.TempDir(), 1<<30)
			if err := tr.Put(ctx, "k", value); err != nil {
				t.Fatal(err)
			}
			_, file := tr.paths(hashKey("k"))
			if err := os.WriteFile(file, bytes.Repeat([]byte{0x5A}, len(value)+4096), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := read(tr, "k")
			if err == nil {
				t.Fatalf("served %d bytes (first %#x) of a file of another length, want a miss", len(got), got[0])
			}
			if !errors.Is(err, tier.ErrNotFound) {
				t.Fatalf("read: %v, want ErrNotFound", err)
			}
			if !tr.KnownAbsent("k") {
				t.Error("the key is still in the index")
			}
			if _, err := os.Lstat(file); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the rewritten file is still in the tier (%v)", err)
			}
		})
	}
}
