// Package fs is the local-disk L2 tier: one file per chunk under base_path,
// named by the SHA-256 of the tier key in a sharded layout (ab/<hash>),
// with an in-memory LRU index rebuilt from the directory at start, so kvdock
// restarts warm.
//
// One level of 256 shard directories, not two (ab/cd/<hash>): a second
// level means 65,536 directories, so nearly every write of a filling tier
// paid a mkdir (measured: 175 µs each, the write ratio at 128 KiB fell to
// 0.3× of a plain file); 256 directories hold millions of files well on
// ext4/XFS (hashed directory indexes).
//
// Durability: a value is written to a temporary name, then renamed into
// place, so a crashed process never leaves a half-written chunk under a real
// name (the page cache survives a process crash; the rename is atomic).
// Values are not fsync'd: the tier is a cache, not a store, an fsync per
// chunk would cost most of the disk's throughput, and what a power loss can
// leave (a short or zero-filled file under a real name) is caught by the
// size check here and by the header's length and checksum in the tier
// layer, both of which make it a miss, never wrong bytes.
package fs

import (
	"container/heap"
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/core/tierstate"
	"kvdock/transfer/tier"
)

const (
	lockName = ".kvdock.lock"
	// tmpPrefix marks our staged writes; a file with it found at start is a
	// write a dead process never finished, removed.
	tmpPrefix = ".kvdock-tmp-"
	// blockSize rounds each file's charge up: a file costs at least a block
	// on disk, which also bounds the index to capacity/4 KiB entries.
	blockSize = 4096
	// ioPiece is how much is written between context checks and the
	// writer's yields to the request path (a few hundred µs of copying).
	ioPiece = 1 << 20
	// readPiece is how much is read between context checks: small enough
	// that the caller's checksum of a piece (GetInto) finds it still in
	// the CPU's cache.
	readPiece = 1 << 20
	// MaxValueBytes is the largest value accepted (one chunk).
	MaxValueBytes = 1 << 30
	hashLen       = sha256.Size
	nameLen       = 2 * hashLen
	dirBatch      = 1024 // directory entries read per call during the scan
)

type entry struct {
	h      [hashLen]byte
	key    string // the key this process wrote it under; "" for a file the start scan found
	size   int64  // exact file length
	charge int64  // size rounded up to a block: what counts against capacity
	mtime  int64  // only used while scanning
	elem   *list.Element
}

// Tier is an open fs tier. Safe for concurrent use.
type Tier struct {
	cfg      FSConfig
	base     string
	stageDir string // "" = stage in the shard directory
	log      *slog.Logger
	lockFile *os.File

	// mu guards the index and the state; it is held over the renames and
	// unlinks that must agree with the index, never over data transfer.
	mu      sync.Mutex
	idx     map[[hashLen]byte]*entry
	lru     *list.List // of *entry, front = most recently used
	used    int64
	state   tierstate.State
	reason  string
	since   time.Time
	noSpace bool
	closed  bool

	readBytes, writeBytes, dropped atomic.Uint64
	// invalid counts the files under chunk names the start scan rejected
	// and removed: reported as corrupt values.
	invalid uint64
	// graveSeq names the files moved aside to be freed outside mu.
	graveSeq atomic.Uint64
	// beforeFree, when set (tests), runs after a Put released mu and
	// before it removes the files it displaced.
	beforeFree func(graves []string)
	// shardMade skips the MkdirAll stat once a shard directory is known.
	shardMade [256]atomic.Bool
	notify    atomic.Pointer[func(tierstate.Tier)] // tier.StateNotifier's hook
	contents  atomic.Pointer[func(string, bool)]   // tier.ContentNotifier's hook
}

var (
	_ tier.Backend       = (*Tier)(nil)
	_ tier.StateNotifier = (*Tier)(nil)
	_ tier.PartsPutter   = (*Tier)(nil)
	_ tier.ReaderInto    = (*Tier)(nil)
	_ tier.AbsenceKnower = (*Tier)(nil)
	_ tier.HeadReader    = (*Tier)(nil)
)

// Open takes base_path for this process (flock on base_path/.kvdock.lock),
// removes stale staged writes, rebuilds the index from the chunk files there
// and returns the tier.
func Open(cfg FSConfig, log *slog.Logger) (*Tier, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.BasePath == "" || !filepath.IsAbs(cfg.BasePath) {
		return nil, fmt.Errorf("fs tier: base_path %q must be an absolute path", cfg.BasePath)
	}
	if cfg.CapacityBytes < blockSize {
		return nil, fmt.Errorf("fs tier %s: capacity %d bytes is too small", cfg.BasePath, cfg.CapacityBytes)
	}
	base := filepath.Clean(cfg.BasePath)
	if err := os.MkdirAll(base, 0o700); err != nil {
		return nil, fmt.Errorf("fs tier: create base_path: %w", err)
	}
	lf, err := takeLock(base)
	if err != nil {
		return nil, err
	}
	t := &Tier{
		// The tier set's logger names the tier (index, type): only the
		// path is this tier's own.
		cfg: cfg, base: base, log: log.With("base_path", base), lockFile: lf,
		idx: make(map[[hashLen]byte]*entry), lru: list.New(),
		state: tierstate.Up, since: time.Now(),
	}
	if cfg.RelativeTmpDir != "" {
		t.stageDir = filepath.Join(base, cfg.RelativeTmpDir)
		if err := os.MkdirAll(t.stageDir, 0o700); err != nil {
			t.releaseLock()
			return nil, fmt.Errorf("fs tier: create relative_tmp_dir: %w", err)
		}
	}
	start := time.Now()
	st, err := t.scan()
	if err != nil {
		t.releaseLock()
		return nil, fmt.Errorf("fs tier %s: rebuild index: %w", base, err)
	}
	t.invalid = uint64(st.invalid)
	// All 256 shard directories up front (a few ms, once per base_path), so
	// no write pays a mkdir.
	for i := range t.shardMade {
		if err := t.makeShard(filepath.Join(base, fmt.Sprintf("%02x", i))); err != nil {
			t.releaseLock()
			return nil, err
		}
		t.shardMade[i].Store(true)
	}
	// A capacity the disk cannot hold fills it: the tier then degrades
	// (writes dropped) instead of evicting. Say so at start.
	var sfs unix.Statfs_t
	if err := unix.Statfs(base, &sfs); err == nil {
		if room := t.used + int64(sfs.Bavail)*int64(sfs.Bsize); room < cfg.CapacityBytes {
			t.log.Warn("fs tier: max_capacity_gb is more than the file system can hold; the tier will degrade when the disk fills",
				"capacity_bytes", cfg.CapacityBytes, "room_bytes", room)
		}
	}
	t.log.Info("fs tier open", "objects", len(t.idx), "used_bytes", t.used, "capacity_bytes", cfg.CapacityBytes,
		"recovered", cfg.RecoverOnStart, "stale_temp_removed", st.tempsRemoved, "evicted_over_capacity", st.evicted,
		"cold_removed", st.coldRemoved, "invalid_removed", st.invalid, "foreign_ignored", st.foreign, "took", time.Since(start))
	return t, nil
}

// makeShard makes shard directory dir. A shard name that is there but not
// a directory (a link to a directory elsewhere, a file) is ours to
// replace: a write or an eviction through it would create or remove files
// outside base_path.
func (t *Tier) makeShard(dir string) error {
	err := os.Mkdir(dir, 0o700)
	if errors.Is(err, os.ErrExist) {
		fi, lerr := os.Lstat(dir)
		if lerr != nil || fi.IsDir() {
			return nil
		}
		t.log.Warn("fs tier: a shard name that is not a directory replaced", "path", dir, "mode", fi.Mode().String())
		if err = os.Remove(dir); err == nil {
			err = os.Mkdir(dir, 0o700)
		}
	}
	if err != nil {
		return fmt.Errorf("fs tier: create shard directory: %w", err)
	}
	return nil
}

// takeLock refuses a base_path another live process holds: two kvdocks
// evicting each other's files from one index-less directory would serve
// misses and count capacity twice.
func takeLock(base string) (*os.File, error) {
	path := filepath.Join(base, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("fs tier: open lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := make([]byte, 200)
		n, _ := f.ReadAt(holder, 0)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			who := strings.TrimSpace(string(holder[:n]))
			if who == "" {
				who = "another process"
			}
			return nil, fmt.Errorf("fs tier: base_path %s is in use: %q holds %s; give each kvdock its own base_path", base, who, path)
		}
		return nil, fmt.Errorf("fs tier: lock %s: %w", path, err)
	}
	host, _ := os.Hostname()
	who := fmt.Sprintf("kvdock pid %d on %s since %s\n", os.Getpid(), host, time.Now().UTC().Format(time.RFC3339))
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(who), 0) // informative only: the flock is the lock
	}
	return f, nil
}

func (t *Tier) releaseLock() {
	_ = unix.Flock(int(t.lockFile.Fd()), unix.LOCK_UN)
	t.lockFile.Close()
}

func hashKey(key string) [hashLen]byte { return sha256.Sum256([]byte(key)) }

// paths returns the shard directory and the final file path of a hash.
func (t *Tier) paths(h [hashLen]byte) (dir, file string) {
	name := hex.EncodeToString(h[:])
	dir = filepath.Join(t.base, name[0:2])
	return dir, filepath.Join(dir, name)
}

func charge(size int64) int64 { return (size + blockSize - 1) / blockSize * blockSize }

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

func (t *Tier) writeFailed(size int64, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.writeFailedLocked(size, err)
}

// writeFailedLocked counts a dropped write and says why the tier is
// degraded; reads keep working from what is already on disk.
func (t *Tier) writeFailedLocked(size int64, err error) {
	t.dropped.Add(1)
	if t.closed {
		return
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		t.noSpace = true
		t.setStateLocked(tierstate.Degraded, fmt.Sprintf("no space left under %s: writes are dropped until space frees (last: %d bytes)", t.base, size))
		return
	}
	t.setStateLocked(tierstate.Degraded, fmt.Sprintf("write failed under %s: %v", t.base, err))
}

func (t *Tier) setStateLocked(s tierstate.State, reason string) {
	if s == t.state && reason == t.reason {
		return
	}
	changed := s != t.state
	if changed {
		t.since = time.Now()
		switch {
		case s == tierstate.Up:
			t.log.Info("fs tier up", "was", t.state)
		case t.closed:
			// A normal stop, not a fault.
			t.log.Info("fs tier closed")
		default:
			t.log.Warn("fs tier "+string(s), "reason", reason)
		}
	}
	t.state, t.reason = s, reason
	if f := t.notify.Load(); changed && f != nil {
		(*f)(tierstate.Tier{Type: "fs", Target: t.base, State: s, Reason: reason, Since: t.since})
	}
}

// NotifyState implements tier.StateNotifier.
func (t *Tier) NotifyState(f func(tierstate.Tier)) { t.notify.Store(&f) }

// dropLocked forgets e and, if asked, buries its file (see buryLocked),
// returning graves with the grave appended.
func (t *Tier) dropLocked(e *entry, removeFile bool, graves []string) []string {
	t.unindexLocked(e)
	if e.key != "" {
		t.tellLocked(e.key, false)
	}
	if removeFile {
		_, file := t.paths(e.h)
		graves = t.buryLocked(file, graves)
	}
	return graves
}

// unindexLocked takes e out of the index and the LRU.
func (t *Tier) unindexLocked(e *entry) {
	delete(t.idx, e.h)
	t.lru.Remove(e.elem)
	t.used -= e.charge
}

// NotifyContents implements tier.ContentNotifier: f is told, under the
// index lock, each value this process wrote as it is installed and as it
// leaves the index (evicted, deleted, cleared, found bad).
func (t *Tier) NotifyContents(f func(key string, present bool)) { t.contents.Store(&f) }

func (t *Tier) tellLocked(key string, present bool) {
	if f := t.contents.Load(); f != nil {
		(*f)(key, present)
	}
}

// forget drops e if it is still the indexed entry for its hash (a Put that
// replaced it meanwhile installed a new entry and a new file).
func (t *Tier) forget(e *entry, removeFile bool) {
	t.mu.Lock()
	var graves []string
	if t.idx[e.h] == e {
		graves = t.dropLocked(e, removeFile, nil)
	}
	t.mu.Unlock()
	for _, g := range graves {
		_ = os.Remove(g)
	}
}

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

// Stats is the backend part of the tier's snapshot. DroppedWrites counts
// the writes this tier could not take (disk full, I/O errors); Corrupt the
// invalid files the start scan removed.
func (t *Tier) Stats() tierstate.Tier {
	t.mu.Lock()
	defer t.mu.Unlock()
	return tierstate.Tier{
		Type: "fs", Target: t.base,
		State: t.state, Reason: t.reason, Since: t.since,
		UsedBytes: t.used, CapacityBytes: t.cfg.CapacityBytes, Objects: int64(len(t.idx)),
		DroppedWrites: t.dropped.Load(), Corrupt: t.invalid,
		ReadBytes: t.readBytes.Load(), WriteBytes: t.writeBytes.Load(),
	}
}

// Close releases base_path; the chunk files stay for the next start.
func (t *Tier) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.setStateLocked(tierstate.Down, "closed")
	t.mu.Unlock()
	t.releaseLock()
	return nil
}

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
// within the capacity) and what was found.
type scanner struct {
	t    *Tier
	now  int64
	kept byAge
	used int64
	st   scanStats
	head []byte // reused for each file's first bytes
}

// scan visits only our shard directories (two lowercase hex digits) and
// only names we write; anything else is left alone. Everything under a
// chunk name is outside input: only a regular file whose header is a tier
// value's, names the key the file is named by and accounts for its exact
// length is indexed and counted against the capacity; anything else under a
// chunk name is removed, so it never pushes a valid chunk out.
func (t *Tier) scan() (scanStats, error) {
	sc := &scanner{t: t, now: time.Now().UnixNano(), head: make([]byte, headProbe)}
	err := eachEntry(t.base, func(d os.DirEntry) error {
		if !d.IsDir() || !isHex(d.Name(), 2) {
			return nil
		}
		if err := sc.shard(d.Name()); err != nil {
			// An unreadable shard costs its chunks, not the tier.
			t.log.Warn("fs tier: shard directory skipped", "dir", filepath.Join(t.base, d.Name()), "err", err)
		}
		return nil
	})
	st := sc.st
	if err != nil {
		return st, err
	}
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
func (sc *scanner) shard(name string) error {
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
			sc.file(fd, name, f)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read directory %s: %w", dir, err)
		}
	}
}

// file handles one entry f of shard directory shard (open as dirfd).
func (sc *scanner) file(dirfd int, shard string, f os.DirEntry) {
	t, name := sc.t, f.Name()
	switch {
	case strings.HasPrefix(name, tmpPrefix) && f.Type().IsRegular():
		if unix.Unlinkat(dirfd, name, 0) == nil {
			sc.st.tempsRemoved++
		}
	case isHex(name, nameLen) && name[:2] == shard && !f.IsDir():
		if !t.cfg.RecoverOnStart {
			if unix.Unlinkat(dirfd, name, 0) == nil {
				sc.st.coldRemoved++
			}
			return
		}
		e, err := sc.check(dirfd, name)
		if errors.Is(err, unix.ENOENT) {
			return // gone meanwhile
		}
		if err != nil {
			// Under our name and not our value: ours to remove (the
			// name, never what a link points to).
			if unix.Unlinkat(dirfd, name, 0) == nil {
				sc.st.invalid++
			}
			// The first few are named; Open's line counts them all.
			if sc.st.invalid <= maxInvalidLogged {
				t.log.Warn("fs tier: invalid chunk file removed", "file", filepath.Join(t.base, shard, name), "err", err)
			}
			return
		}
		heap.Push(&sc.kept, e)
		sc.used += e.charge
		for sc.used > t.cfg.CapacityBytes {
			old := heap.Pop(&sc.kept).(*entry)
			sc.used -= old.charge
			if t.unlinkChunk(old.h) == nil {
				sc.st.evicted++
			}
		}
	default:
		sc.st.foreign++
	}
}

// check opens chunk file name in dirfd (without blocking or following a
// link) and returns its entry when it is a regular file within the limits
// whose header names the key it is named by and accounts for its length.
// A future mtime (a clock set back, or a file planted to look newest)
// ranks as the oldest, so it is the first to go when the files exceed the
// capacity.
func (sc *scanner) check(dirfd int, name string) (*entry, error) {
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
	head := sc.head[:min(int64(len(sc.head)), size)]
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
