package fs

import (
	"context"
	"errors"
	"fmt"
	"os"

	"kvdock/transfer/tier"
)

var _ tier.Inventory = (*Tier)(nil)

// Keys implements tier.Inventory: the index holds only files whose header
// named the key they are filed under (checked at the start scan) or that
// this process wrote; each key is read back from its file's header.
func (t *Tier) Keys(ctx context.Context, limit int) ([]string, int64, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, 0, errors.New("fs tier: keys: closed")
	}
	total := int64(len(t.idx))
	type listed struct {
		h    [hashLen]byte
		size int64
	}
	hs := make([]listed, 0, min(limit, len(t.idx)))
	for el := t.lru.Front(); el != nil && len(hs) < limit; el = el.Next() {
		e := el.Value.(*entry)
		hs = append(hs, listed{e.h, e.size})
	}
	t.mu.Unlock()
	out := make([]string, 0, len(hs))
	head := make([]byte, tier.MaxHeaderLen)
	for _, h := range hs {
		if err := ctx.Err(); err != nil {
			return nil, 0, fmt.Errorf("fs tier: keys: %w", err)
		}
		dir, file := t.paths(h.h)
		key, err := storedKey(dir, file, h.size, head)
		if err != nil {
			continue // replaced or removed since: not listed
		}
		out = append(out, key)
	}
	return out, total, nil
}

// storedKey reads the key from the header of the chunk file, opened as a
// load opens it (no link followed, a regular file of the indexed size).
func storedKey(dir, file string, size int64, head []byte) (string, error) {
	f, err := openChunk(dir, file, size)
	if err != nil {
		return "", err
	}
	defer f.Close()
	n, err := f.ReadAt(head[:min(int64(len(head)), size)], 0)
	if err != nil && int64(n) < min(int64(len(head)), size) {
		return "", err
	}
	key, err := tier.StoredKey(head[:n], size)
	if err != nil {
		return "", err
	}
	return string(key), nil
}

// Clear implements tier.Inventory: every indexed chunk file goes, nothing
// else under base_path (the lock file, files of other names) is touched.
func (t *Tier) Clear(ctx context.Context) (objects, bytes int64, err error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, fmt.Errorf("fs tier: clear: %w", err)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return 0, 0, errors.New("fs tier: clear: closed")
	}
	var graves []string
	for _, e := range t.idx {
		objects++
		bytes += e.charge
		graves = t.dropLocked(e, true, graves)
	}
	t.mu.Unlock()
	var errs []error
	for _, g := range graves {
		if err := os.Remove(g); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return objects, bytes, fmt.Errorf("fs tier: clear: %w", err)
	}
	return objects, bytes, nil
}
