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
	"container/list"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
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
