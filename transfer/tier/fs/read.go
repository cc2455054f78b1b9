// The read path: a chunk file opened, checked against the index and read
// in pieces.

package fs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"kvdock/transfer/tier"
)

// Get reads key's value. Only a file of exactly the indexed length is
// served; anything else is a miss and the file is removed.
func (t *Tier) Get(ctx context.Context, key string) ([]byte, error) {
	var buf []byte
	err := t.read(ctx, key, func(size int64) ([][]byte, error) {
		buf = make([]byte, size)
		return [][]byte{buf}, nil
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("fs tier: get: %w", err)
	}
	return buf, nil
}

// GetInto implements tier.ReaderInto: the file is read into head, then
// payload, when its length is theirs together; each sees the payload's
// pieces (readPiece bytes) as they are read.
func (t *Tier) GetInto(ctx context.Context, key string, head, payload []byte, each func(piece []byte)) error {
	err := t.read(ctx, key, func(size int64) ([][]byte, error) {
		if want := int64(len(head) + len(payload)); size != want {
			return nil, fmt.Errorf("%d bytes, want %d: %w", size, want, tier.ErrSizeMismatch)
		}
		return [][]byte{head, payload}, nil
	}, func(part int, piece []byte) {
		if part == 1 && each != nil {
			each(piece)
		}
	})
	if err != nil {
		return fmt.Errorf("fs tier: get: %w", err)
	}
	return nil
}

// GetHead implements tier.HeadReader: the first len(buf) bytes of key's
// file, and its length.
func (t *Tier) GetHead(ctx context.Context, key string, buf []byte) (n int, size int64, err error) {
	err = t.read(ctx, key, func(sz int64) ([][]byte, error) {
		size, n = sz, int(min(sz, int64(len(buf))))
		return [][]byte{buf[:n]}, nil
	}, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("fs tier: get head: %w", err)
	}
	return n, size, nil
}

// read reads key's file into the buffers dst returns for its length,
// calling each (when set) with every piece read and the index of its
// buffer. Only a file of exactly the indexed length is read; anything else
// is a miss and the file is removed.
func (t *Tier) read(ctx context.Context, key string, dst func(size int64) ([][]byte, error), each func(part int, piece []byte)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	h := hashKey(key)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return errors.New("closed")
	}
	e := t.idx[h]
	if e == nil {
		t.mu.Unlock()
		return tier.ErrNotFound
	}
	t.lru.MoveToFront(e.elem)
	size := e.size
	t.mu.Unlock()

	dir, file := t.paths(h)
	f, err := openChunk(dir, file, size)
	if err != nil {
		switch {
		case errors.Is(err, errNotShard):
			t.forget(e, false) // nothing removed through it
			return fmt.Errorf("%w: %w", err, tier.ErrNotFound)
		case errors.Is(err, os.ErrNotExist):
			t.forget(e, false)
			return fmt.Errorf("file gone: %w", tier.ErrNotFound)
		case errors.Is(err, tier.ErrCorrupt):
			t.forget(e, true)
			t.log.Warn("fs tier: chunk file changed behind the index, removed", "file", file, "err", err)
			return fmt.Errorf("%w (%w)", err, tier.ErrNotFound)
		}
		return err
	}
	defer f.Close()
	parts, err := dst(size)
	if err != nil {
		return err
	}
	for part, buf := range parts {
		for off := 0; off < len(buf); {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(readPiece, len(buf)-off)
			if _, err := io.ReadFull(f, buf[off:off+n]); err != nil {
				if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
					t.forget(e, true)
					return fmt.Errorf("file shrank while read: %w (%w)", tier.ErrCorrupt, tier.ErrNotFound)
				}
				return fmt.Errorf("read: %w", err)
			}
			if each != nil {
				each(part, buf[off:off+n])
			}
			off += n
		}
	}
	var got int
	for _, buf := range parts {
		got += len(buf)
	}
	t.readBytes.Add(uint64(got))
	return nil
}

// errNotShard is openChunk's error for a shard directory replaced (by a
// link, a file) behind our back.
var errNotShard = errors.New("shard directory is not a directory")

// openChunk opens chunk file file in shard directory dir for reading when
// it is a regular file of exactly size bytes. A file under a chunk name is
// outside input: it is opened without following a link (nor a link in
// place of its shard directory) and without blocking (a FIFO would wait
// for a writer forever, out of reach of any context), and its type and
// length are checked (fstat) before a byte is read, so a planted device,
// FIFO or huge sparse file costs one open. A file that is not what the
// index says wraps tier.ErrCorrupt.
func openChunk(dir, file string, size int64) (*os.File, error) {
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, fmt.Errorf("%s: %w", dir, errNotShard)
		}
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	fd, err := unix.Openat(dfd, filepath.Base(file), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	unix.Close(dfd)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("open %s: a symbolic link: %w", file, tier.ErrCorrupt)
		}
		return nil, &os.PathError{Op: "open", Path: file, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fstat %s: %w", file, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		unix.Close(fd)
		return nil, fmt.Errorf("%s is not a regular file (mode %#o): %w", file, st.Mode, tier.ErrCorrupt)
	case st.Size != size:
		unix.Close(fd)
		return nil, fmt.Errorf("%s is %d bytes, the index says %d: %w", file, st.Size, size, tier.ErrCorrupt)
	}
	// A regular file never blocks; the flag is cleared so that os.File
	// reads it as the plain file it is.
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: clear O_NONBLOCK: %w", file, err)
	}
	return os.NewFile(uintptr(fd), file), nil
}

// Has counts the leading keys present in the index.
func (t *Tier) Has(ctx context.Context, keys []string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("fs tier: has: %w", err)
	}
	hs := make([][hashLen]byte, len(keys))
	for i, k := range keys {
		hs[i] = hashKey(k)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, errors.New("fs tier: has: closed")
	}
	for i, h := range hs {
		if t.idx[h] == nil {
			return i, nil
		}
	}
	return len(hs), nil
}

// KnownAbsent implements tier.AbsenceKnower: the index is the tier.
func (t *Tier) KnownAbsent(key string) bool {
	h := hashKey(key)
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.idx[h] == nil
}
