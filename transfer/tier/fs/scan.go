// The start scan: the index rebuilt from the chunk files under base_path,
// stale staged writes removed, files that are not what their name says
// rejected.

package fs

import (
	"container/heap"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/transfer/tier"
)

type scanStats struct{ tempsRemoved, evicted, coldRemoved, invalid, foreign int }

// byAge is a min-heap of entries by mtime: the scan keeps the newest files
// that fit the capacity, so its memory is bounded by capacity/4 KiB entries
// however many files the directory holds.
type byAge []*entry

func (a byAge) Len() int           { return len(a) }
func (a byAge) Less(i, j int) bool { return a[i].mtime < a[j].mtime }
func (a byAge) Swap(i, j int)      { a[i], a[j] = a[j], a[i] }
func (a *byAge) Push(x any)        { *a = append(*a, x.(*entry)) }
func (a *byAge) Pop() any {
	old := *a
	e := old[len(old)-1]
	*a = old[:len(old)-1]
	return e
}

// scanner is one scan's state: the files kept so far (newest by mtime
// within the capacity) and what was found, shared by the scan's workers
// under mu (the file system calls, which are the scan's cost, run outside
// it).
type scanner struct {
	t   *Tier
	now int64

	mu   sync.Mutex
	kept byAge
	used int64
	st   scanStats
}

// scanWorkers bounds the shards scanned at once: a restart serves once its
// tiers are open, and the scan's cost is a few system calls a file, which
// spread over the cores (TestScanAcrossWorkersKeepsTheNewest).
func scanWorkers() int { return min(runtime.GOMAXPROCS(0), 8) }

// scan visits only our shard directories (two lowercase hex digits) and
// only names we write; anything else is left alone. Everything under a
// chunk name is outside input: only a regular file whose header is a tier
// value's, names the key the file is named by and accounts for its exact
// length is indexed and counted against the capacity; anything else under a
// chunk name is removed, so it never pushes a valid chunk out.
func (t *Tier) scan() (scanStats, error) {
	sc := &scanner{t: t, now: time.Now().UnixNano()}
	var shards []string // at most 256: two hex digits
	err := eachEntry(t.base, func(d os.DirEntry) error {
		if d.IsDir() && isHex(d.Name(), 2) {
			shards = append(shards, d.Name())
		}
		return nil
	})
	if err != nil {
		return sc.st, err
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(scanWorkers(), len(shards)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			head := make([]byte, headProbe) // reused for each file's first bytes
			for i := next.Add(1) - 1; i < int64(len(shards)); i = next.Add(1) - 1 {
				if err := sc.shard(shards[i], head); err != nil {
					// An unreadable shard costs its chunks, not the tier.
					t.log.Warn("fs tier: shard directory skipped", "dir", filepath.Join(t.base, shards[i]), "err", err)
				}
			}
		}()
	}
	wg.Wait()
	st := sc.st
	if t.stageDir != "" {
		err = eachEntry(t.stageDir, func(f os.DirEntry) error {
			if strings.HasPrefix(f.Name(), tmpPrefix) && f.Type().IsRegular() {
				if os.Remove(filepath.Join(t.stageDir, f.Name())) == nil {
					st.tempsRemoved++
				}
			}
			return nil
		})
		if err != nil {
			return st, err
		}
	}
	// Oldest first, each pushed to the front: the newest ends most recent.
	for sc.kept.Len() > 0 {
		e := heap.Pop(&sc.kept).(*entry)
		e.elem = t.lru.PushFront(e)
		t.idx[e.h] = e
		t.used += e.charge
	}
	return st, nil
}

// headProbe is how much of a file the scan reads first to check its
// header: one block holds the header of any realistic key; a longer one
// is read again, up to tier.MaxHeaderLen.
const headProbe = blockSize

// maxInvalidLogged bounds the scan's log lines about invalid files: a
// directory planted with millions of them logs a handful and a count.
const maxInvalidLogged = 8

// shard scans one shard directory. It is opened without following a link
// (a shard replaced by a link to elsewhere is not ours), and every file in
// it is opened and removed relative to it, so nothing outside base_path is
// ever removed.
func (sc *scanner) shard(name string, head []byte) error {
	dir := filepath.Join(sc.t.base, name)
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	d := os.NewFile(uintptr(fd), dir)
	defer d.Close()
	for {
		ents, err := d.ReadDir(dirBatch)
		for _, f := range ents {
			sc.file(fd, name, f, head)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read directory %s: %w", dir, err)
		}
	}
}

// file handles one entry f of shard directory shard (open as dirfd),
// reading its first bytes into head.
func (sc *scanner) file(dirfd int, shard string, f os.DirEntry, head []byte) {
	t, name := sc.t, f.Name()
	switch {
	case strings.HasPrefix(name, tmpPrefix) && f.Type().IsRegular():
		if unix.Unlinkat(dirfd, name, 0) == nil {
			sc.count(&sc.st.tempsRemoved)
		}
	case isHex(name, nameLen) && name[:2] == shard && !f.IsDir():
		if !t.cfg.RecoverOnStart {
			if unix.Unlinkat(dirfd, name, 0) == nil {
				sc.count(&sc.st.coldRemoved)
			}
			return
		}
		e, err := sc.check(dirfd, name, head)
		if errors.Is(err, unix.ENOENT) {
			return // gone meanwhile
		}
		if err != nil {
			// Under our name and not our value: ours to remove (the
			// name, never what a link points to).
			if unix.Unlinkat(dirfd, name, 0) == nil {
				// The first few are named; Open's line counts them all.
				if sc.count(&sc.st.invalid) <= maxInvalidLogged {
					t.log.Warn("fs tier: invalid chunk file removed", "file", filepath.Join(t.base, shard, name), "err", err)
				}
			}
			return
		}
		sc.keep(e)
	default:
		sc.count(&sc.st.foreign)
	}
}

// count adds one to the counter c of sc.st and returns it.
func (sc *scanner) count(c *int) int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	*c++
	return *c
}

// keep adds e to the files kept, removing the oldest while they pass the
// capacity.
func (sc *scanner) keep(e *entry) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	heap.Push(&sc.kept, e)
	sc.used += e.charge
	for sc.used > sc.t.cfg.CapacityBytes {
		old := heap.Pop(&sc.kept).(*entry)
		sc.used -= old.charge
		if sc.t.unlinkChunk(old.h) == nil {
			sc.st.evicted++
		}
	}
}

// check opens chunk file name in dirfd (without blocking or following a
// link) and returns its entry when it is a regular file within the limits
// whose header names the key it is named by and accounts for its length.
// A future mtime (a clock set back, or a file planted to look newest)
// ranks as the oldest, so it is the first to go when the files exceed the
// capacity.
func (sc *scanner) check(dirfd int, name string, probe []byte) (*entry, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, errors.New("a symbolic link")
		}
		return nil, fmt.Errorf("open: %w", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("not a regular file (mode %#o)", st.Mode)
	}
	size := st.Size
	if size > MaxValueBytes || charge(size) > sc.t.cfg.CapacityBytes {
		return nil, fmt.Errorf("%d bytes: over the limit of a value (%d bytes, capacity %d)", size, MaxValueBytes, sc.t.cfg.CapacityBytes)
	}
	head := probe[:min(int64(len(probe)), size)]
	if err := preadFull(fd, head); err != nil {
		return nil, err
	}
	key, err := tier.StoredKey(head, size)
	if errors.Is(err, tier.ErrHeadShort) {
		head = make([]byte, min(int64(tier.MaxHeaderLen), size))
		if err := preadFull(fd, head); err != nil {
			return nil, err
		}
		key, err = tier.StoredKey(head, size)
	}
	if err != nil {
		return nil, err
	}
	e := &entry{size: size, charge: charge(size), mtime: st.Mtim.Nano()}
	if _, err := hex.Decode(e.h[:], []byte(name)); err != nil {
		return nil, fmt.Errorf("name: %w", err)
	}
	if sha256.Sum256(key) != e.h {
		return nil, errors.New("its header names another key")
	}
	if e.mtime > sc.now {
		e.mtime = 0
	}
	return e, nil
}

// preadFull reads len(b) bytes from the start of fd.
func preadFull(fd int, b []byte) error {
	for off := 0; off < len(b); {
		n, err := unix.Pread(fd, b[off:], int64(off))
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("read: %w", err)
		case n == 0:
			return fmt.Errorf("read: %w", io.ErrUnexpectedEOF)
		}
		off += n
	}
	return nil
}

// unlinkChunk removes the chunk file of h through its shard directory,
// opened without following a link.
func (t *Tier) unlinkChunk(h [hashLen]byte) error {
	name := hex.EncodeToString(h[:])
	dir := filepath.Join(t.base, name[:2])
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Unlinkat(fd, name, 0); err != nil {
		return &os.PathError{Op: "unlink", Path: filepath.Join(dir, name), Err: err}
	}
	return nil
}

// eachEntry calls fn for the entries of dir, read in batches so a huge
// directory costs bounded memory.
func eachEntry(dir string, fn func(os.DirEntry) error) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	for {
		ents, err := d.ReadDir(dirBatch)
		for _, e := range ents {
			if err := fn(e); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read directory %s: %w", dir, err)
		}
	}
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < n; i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
