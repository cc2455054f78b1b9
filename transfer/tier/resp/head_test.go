package resp

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"kvdock/transfer/tier"
)

// GetHead reads at most the buffer's length of a value, with the value's
// whole length, so that a value of another layout is judged by its header
// alone; an absent key is tier.ErrNotFound.
func TestGetHeadReadsOnlyTheStart(t *testing.T) {
	tr, _ := startTier(t)
	ctx := context.Background()
	v := value(7, 1<<20)
	if err := tr.Put(ctx, key(1), v); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 300)
	n, size, err := tr.GetHead(ctx, key(1), buf)
	if err != nil || n != len(buf) || size != int64(len(v)) || !bytes.Equal(buf[:n], v[:n]) {
		t.Fatalf("GetHead = %d bytes, size %d, %v", n, size, err)
	}
	short := value(8, 100)
	if err := tr.Put(ctx, key(2), short); err != nil {
		t.Fatal(err)
	}
	if n, size, err := tr.GetHead(ctx, key(2), buf); err != nil || n != 100 || size != 100 || !bytes.Equal(buf[:n], short) {
		t.Fatalf("GetHead of a short value = %d bytes, size %d, %v", n, size, err)
	}
	if _, _, err := tr.GetHead(ctx, key(3), buf); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("GetHead of an absent key: %v, want ErrNotFound", err)
	}
	if st := tr.Stats(); st.State != "up" {
		t.Fatalf("tier after GetHead: %+v", st)
	}
}
