// The write path: a value staged under a temporary name, renamed into
// place, and the least recently used chunks evicted to make room.

package fs

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"kvdock/core/tierstate"
	"kvdock/transfer/tier"
)

// Put stores value under key, evicting least recently used chunks to stay
// within the capacity. A write the disk cannot take is dropped, counted and
// turns the tier degraded until a later write succeeds.
func (t *Tier) Put(ctx context.Context, key string, value []byte) error {
	return t.put(ctx, key, [][]byte{value}, nil, nil)
}

// PutParts implements tier.PartsPutter: the value is head then payload,
// written to the file from where they lie; valid is asked after the last
// byte is written, and a false answer discards the file; pace (when not
// nil) is called before each piece (ioPiece) is written.
func (t *Tier) PutParts(ctx context.Context, key string, head, payload []byte, valid func() bool, pace func()) error {
	return t.put(ctx, key, [][]byte{head, payload}, valid, pace)
}

func (t *Tier) put(ctx context.Context, key string, parts [][]byte, valid func() bool, pace func()) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fs tier: put: %w", err)
	}
	var size int64
	for _, p := range parts {
		size += int64(len(p))
	}
	if size > MaxValueBytes || charge(size) > t.cfg.CapacityBytes {
		return fmt.Errorf("fs tier: put: value of %d bytes exceeds the tier's limit (%d bytes per value, capacity %d)", size, MaxValueBytes, t.cfg.CapacityBytes)
	}
	h := hashKey(key)
	dir, final := t.paths(h)

	t.mu.Lock()
	closed, noSpace := t.closed, t.noSpace
	t.mu.Unlock()
	if closed {
		return errors.New("fs tier: put: closed")
	}
	// While the disk is known full, a write that cannot fit is dropped
	// without touching the disk; one that can is tried and, if it lands,
	// brings the tier back up.
	if noSpace {
		var fs unix.Statfs_t
		if err := unix.Statfs(t.base, &fs); err == nil && int64(fs.Bavail)*int64(fs.Bsize) < charge(size)+4*blockSize {
			t.dropped.Add(1)
			return fmt.Errorf("fs tier: put of %d bytes dropped: %w", size, syscall.ENOSPC)
		}
	}

	tmp, err := t.writeTemp(ctx, dir, h, parts, pace)
	if err != nil {
		if ctx.Err() == nil {
			t.writeFailed(size, err)
		}
		return fmt.Errorf("fs tier: put of %d bytes: %w", size, err)
	}
	if valid != nil && !valid() {
		os.Remove(tmp)
		return fmt.Errorf("fs tier: put of %d bytes discarded: %w", size, tier.ErrSourceChanged)
	}

	graves, err := t.install(key, h, tmp, final, size)
	if t.beforeFree != nil {
		t.beforeFree(graves)
	}
	// The buried files' blocks are freed here, outside the index lock: an
	// unlink of a 32 MiB file takes milliseconds (tens with discard), and
	// every lookup's Has waits on that lock.
	for _, g := range graves {
		if rerr := os.Remove(g); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			t.log.Warn("fs tier: remove chunk file", "file", g, "err", rerr)
		}
	}
	return err
}

// install renames the written temporary file tmp into place as final under
// the index lock, evicting least recently used chunks to make room. The
// files it displaces (victims, the key's previous value) are only renamed
// aside to temporary names (cheap: no blocks freed); it returns those for
// the caller to remove after the lock is released.
func (t *Tier) install(key string, h [hashLen]byte, tmp, final string, size int64) ([]string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return []string{tmp}, errors.New("fs tier: put: closed")
	}
	var graves []string
	old := t.idx[h]
	need := charge(size)
	if old != nil {
		need -= old.charge
	}
	for el := t.lru.Back(); t.used+need > t.cfg.CapacityBytes && el != nil; {
		victim := el.Value.(*entry)
		el = el.Prev()
		if victim != old {
			graves = t.dropLocked(victim, true, graves)
		}
	}
	// The previous value (indexed or not) is moved aside first, so the
	// rename below replaces nothing and frees nothing under the lock.
	graves = t.buryLocked(final, graves)
	if err := os.Rename(tmp, final); err != nil {
		graves = append(graves, tmp)
		if errors.Is(err, os.ErrNotExist) {
			t.shardMade[h[0]].Store(false) // removed behind our back: the next write makes it again
		}
		if old != nil {
			graves = t.dropLocked(old, false, graves) // its file is buried
		}
		t.writeFailedLocked(size, err)
		return graves, fmt.Errorf("fs tier: put: rename into place: %w", err)
	}
	told := false // a rewrite of a value this process wrote: held still
	if old != nil {
		told = old.key != ""
		t.unindexLocked(old)
	}
	e := &entry{h: h, key: key, size: size, charge: charge(size)}
	e.elem = t.lru.PushFront(e)
	t.idx[h] = e
	if !told {
		t.tellLocked(key, true)
	}
	t.used += e.charge
	t.writeBytes.Add(uint64(size))
	if t.state != tierstate.Up {
		t.noSpace = false
		t.setStateLocked(tierstate.Up, "")
	}
	return graves, nil
}

// buryLocked renames file aside to a fresh temporary name in its directory
// and appends that name to graves; an absent file appends nothing. A grave
// left by a crash is removed at the next start like any staged write. When
// the rename fails otherwise, the file is removed in place.
func (t *Tier) buryLocked(file string, graves []string) []string {
	grave := filepath.Join(filepath.Dir(file), fmt.Sprintf("%sgone-%d", tmpPrefix, t.graveSeq.Add(1)))
	err := os.Rename(file, grave)
	switch {
	case err == nil:
		return append(graves, grave)
	case errors.Is(err, os.ErrNotExist):
		return graves
	}
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.log.Warn("fs tier: remove chunk file", "file", file, "err", err)
	}
	return graves
}

// writeTemp writes value to a fresh temporary file beside its final place
// (or in relative_tmp_dir) and returns its path; on error nothing is left.
func (t *Tier) writeTemp(ctx context.Context, dir string, h [hashLen]byte, parts [][]byte, pace func()) (path string, err error) {
	if !t.shardMade[h[0]].Load() {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", fmt.Errorf("create shard directory: %w", err)
		}
		t.shardMade[h[0]].Store(true)
	}
	stage := dir
	if t.stageDir != "" {
		stage = t.stageDir
	}
	f, err := os.CreateTemp(stage, tmpPrefix+hex.EncodeToString(h[:8])+"-*")
	if errors.Is(err, os.ErrNotExist) && t.stageDir == "" {
		// The shard directory was removed behind our back: make it again.
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", fmt.Errorf("create shard directory: %w", err)
		}
		f, err = os.CreateTemp(stage, tmpPrefix+hex.EncodeToString(h[:8])+"-*")
	}
	if err != nil {
		return "", fmt.Errorf("create temporary file: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	for _, value := range parts {
		for off := 0; off < len(value); {
			if err := ctx.Err(); err != nil {
				return "", err
			}
			if pace != nil {
				pace()
			}
			n := min(ioPiece, len(value)-off)
			if _, err := f.Write(value[off : off+n]); err != nil {
				return "", fmt.Errorf("write: %w", err)
			}
			off += n
		}
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("close: %w", err)
	}
	return f.Name(), nil
}

// Delete removes key's file and index entry; absent is not an error.
func (t *Tier) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fs tier: delete: %w", err)
	}
	h := hashKey(key)
	_, file := t.paths(h)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return errors.New("fs tier: delete: closed")
	}
	if e := t.idx[h]; e != nil {
		t.dropLocked(e, false, nil)
	}
	grave := filepath.Join(filepath.Dir(file), fmt.Sprintf("%sgone-%d", tmpPrefix, t.graveSeq.Add(1)))
	err := os.Rename(file, grave)
	t.mu.Unlock()
	switch {
	case err == nil:
		file = grave // freed outside the lock
	case errors.Is(err, os.ErrNotExist):
		return nil
	}
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("fs tier: delete: %w", err)
	}
	return nil
}
