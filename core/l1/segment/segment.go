// Package segment maps the memory behind the L1 pool: a named POSIX
// shared-memory segment that workers attach by name (zero-copy transfers), or
// private anonymous memory when shared memory is off or cannot hold the pool.
//
// A named segment is /dev/shm/<name> (what shm_open and Python's SharedMemory
// use), mode 0600, with every page reserved at creation (fallocate), held
// under an exclusive flock for the owner's life so that other servers can tell
// a live segment from a stale one, and unlinked on Close. A second hard link,
// /dev/shm/.kvdock-seg-<name>, marks the segment as kvdock's: only kvdock
// takes the flock, so an unlocked segment without the marker may belong to a
// live server that never locks (Python LMCache) and is left alone.
//
// Before a segment is created, stale segments are removed (CleanStale): the
// requested name if its flock can be taken, and kvdock-marked segments of our
// uid whose flock can be taken (their owner died). A segment whose flock is
// held is never touched, nor other users' files under other names.
package segment

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Prefix starts every pool segment name; stale cleanup only looks at these.
const Prefix = "lmcache_l1_pool_"

// DefaultDir is where shm_open places segments on Linux.
const DefaultDir = "/dev/shm"

// tmpPrefix names a segment being created: it is flocked before it is
// linked under its real name, so a live segment is never visible unlocked.
const tmpPrefix = ".kvdock-new-"

// markerPrefix names the second link of a kvdock segment, markerPrefix+name:
// the same inode as name, proof that kvdock created it and holds its flock
// while alive.
const markerPrefix = ".kvdock-seg-"

// ErrBusy means the requested segment name is held by a live process.
var ErrBusy = errors.New("shared memory segment is held by a live process")

// NormalizeName strips leading slashes and adds Prefix unless the name
// already carries it: "foo" and "/foo" → "lmcache_l1_pool_foo".
func NormalizeName(name string) string {
	name = strings.TrimLeft(name, "/")
	if strings.HasPrefix(name, Prefix) {
		return name
	}
	return Prefix + name
}

// ValidName reports whether a normalised name is usable as a segment name:
// [A-Za-z0-9_.-], at most 255 bytes, something after the prefix.
func ValidName(name string) error {
	if len(name) > 255 || len(name) <= len(Prefix) {
		return fmt.Errorf("segment name %q: want %s followed by 1–%d characters", name, Prefix, 255-len(Prefix))
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return fmt.Errorf("segment name %q: character %q not allowed (use A-Z a-z 0-9 _ . -)", name, c)
		}
	}
	return nil
}

// Options selects the memory to map.
type Options struct {
	// Name is the segment name, normalised with NormalizeName; "" means
	// anonymous private memory.
	Name string
	// NoShmReason is the Decision reason when Name is "".
	NoShmReason string
	// Dir is the shared-memory directory; "" means DefaultDir.
	Dir string
	// Size is the mapping size in bytes.
	Size int64
	// Prefault populates every page in the background after Open returns.
	Prefault bool
	// Statfs returns the free bytes of dir; nil means statfs(2). Tests
	// inject small numbers to exercise the capacity fallback.
	Statfs func(dir string) (int64, error)
	// Logger receives stale-cleanup and fallback notices; nil discards.
	Logger *slog.Logger
}

// Decision says which memory backs the pool and why.
type Decision struct {
	Segment string // segment name; "" when anonymous
	Size    int64  // bytes mapped
	Shared  bool   // workers can attach Segment
	Reason  string // human sentence for logs, /status and the dashboard
	ShmFree int64  // free bytes in the shm directory when checked; 0 if not checked
}

// Segment is one mapped region.
type Segment struct {
	dec     Decision
	dir     string
	mem     []byte
	fd      int // -1 when anonymous
	stop    atomic.Bool
	done    chan struct{}
	faulted atomic.Int64
	once    sync.Once
	log     *slog.Logger
}

// Open maps the memory described by o. A name held by a live process is an
// error wrapping ErrBusy; a pool that does not fit in the shm directory, a
// segment that cannot be created or whose pages cannot be reserved (the
// directory filled up since it was checked) falls back to anonymous memory
// with the reason in Decision.
func Open(o Options) (*Segment, error) {
	if o.Size <= 0 {
		return nil, fmt.Errorf("segment: size %d bytes, want > 0", o.Size)
	}
	if o.Dir == "" {
		o.Dir = DefaultDir
	}
	if o.Statfs == nil {
		o.Statfs = statfsFree
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.Name == "" {
		reason := o.NoShmReason
		if reason == "" {
			reason = "shared memory off"
		}
		return openAnon(o, Decision{Size: o.Size, Reason: reason}, log)
	}
	name := NormalizeName(o.Name)
	if err := ValidName(name); err != nil {
		return nil, err
	}
	removed, err := CleanStale(o.Dir, name, log)
	if err != nil {
		log.Warn("stale shared-memory cleanup incomplete", "dir", o.Dir, "err", err)
	}
	path := filepath.Join(o.Dir, name)
	if _, err := os.Lstat(path); err == nil {
		// CleanStale left it: a live process holds it, or it could not be
		// checked (the warning above says why).
		return nil, fmt.Errorf("segment %s in %s: %w; stop that server or choose another --shm-name", name, o.Dir, ErrBusy)
	}
	free, err := o.Statfs(o.Dir)
	if err != nil {
		reason := fmt.Sprintf("cannot check free space of %s (%v); using private memory", o.Dir, err)
		log.Warn("shared memory off", "reason", reason)
		return openAnon(o, Decision{Size: o.Size, Reason: reason}, log)
	}
	if o.Size > free {
		reason := fmt.Sprintf("%s has %s free, pool needs %s; using private memory", o.Dir, Human(free), Human(o.Size))
		log.Warn("shared memory off", "reason", reason)
		return openAnon(o, Decision{Size: o.Size, Reason: reason, ShmFree: free}, log)
	}
	s, err := create(o, name, path, free, log)
	if errors.Is(err, ErrBusy) {
		return nil, err
	}
	var re *reserveError
	if errors.As(err, &re) {
		reason := re.Error() + "; using private memory"
		log.Warn("shared memory off", "reason", reason)
		return openAnon(o, Decision{Size: o.Size, Reason: reason, ShmFree: free}, log)
	}
	if err != nil {
		reason := fmt.Sprintf("cannot create segment %s (%v); using private memory", name, err)
		log.Warn("shared memory off", "reason", reason)
		return openAnon(o, Decision{Size: o.Size, Reason: reason, ShmFree: free}, log)
	}
	s.dec.Reason = fmt.Sprintf("segment %s created, %s", name, Human(o.Size))
	if len(removed) > 0 {
		s.dec.Reason += fmt.Sprintf(" (removed %d stale segment(s))", len(removed))
	}
	s.startPrefault(o.Prefault)
	return s, nil
}

func create(o Options, name, path string, free int64, log *slog.Logger) (*Segment, error) {
	var fd int
	var tmp string
	for attempt := 0; ; attempt++ {
		tmp = filepath.Join(o.Dir, fmt.Sprintf("%s%d-%016x", tmpPrefix, os.Getpid(), rand.Uint64()))
		var err error
		fd, err = unix.Open(tmp, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("create %s: %w", tmp, err)
		}
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			unix.Close(fd)
			unix.Unlink(tmp)
			if attempt < 3 {
				continue
			}
			return nil, fmt.Errorf("lock %s: %w", tmp, err)
		}
		break
	}
	fail := func(err error) (*Segment, error) {
		unix.Unlink(tmp)
		unix.Close(fd)
		return nil, err
	}
	// fchmod because the umask may have narrowed the mode; 0600 is the contract.
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return fail(fmt.Errorf("chmod %s: %w", tmp, err))
	}
	if err := reserve(fd, o.Size); err != nil {
		return fail(&reserveError{dir: o.Dir, size: o.Size, err: err})
	}
	if err := unix.Link(tmp, path); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fail(fmt.Errorf("segment %s in %s appeared while starting: %w", name, o.Dir, ErrBusy))
		}
		return fail(fmt.Errorf("publish %s as %s: %w", tmp, path, err))
	}
	mark(o.Dir, name, tmp, log)
	unix.Unlink(tmp)
	mem, err := unix.Mmap(fd, 0, int(o.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unlinkIfSame(fd, path)
		unlinkIfSame(fd, filepath.Join(o.Dir, markerPrefix+name))
		unix.Close(fd)
		return nil, fmt.Errorf("map %s: %w", path, err)
	}
	log.Info("shared memory segment created", "segment", name, "dir", o.Dir, "bytes", o.Size)
	return &Segment{
		dec:  Decision{Segment: name, Size: o.Size, Shared: true, ShmFree: free},
		dir:  o.Dir,
		mem:  mem,
		fd:   fd,
		done: make(chan struct{}),
		log:  log,
	}, nil
}

// reserveStep is how much one fallocate call reserves. tmpfs undoes a call
// that a signal interrupts, so one call over a large pool might never finish
// under a stream of signals (a profiler's); steps keep their progress.
const reserveStep = 1 << 30

// reserve allocates every page of the segment now (fallocate, mode 0, which
// also sets the size), so that a /dev/shm that fills up later cannot SIGBUS
// the process on first touch; on a full /dev/shm it fails here instead, with
// ENOSPC. It costs about 0.3 s per GiB on tmpfs.
func reserve(fd int, size int64) error {
	for off := int64(0); off < size; {
		n := min(reserveStep, size-off)
		err := unix.Fallocate(fd, 0, off, n)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		off += n
	}
	return nil
}

// reserveError is a failed reservation, worded for the Decision reason:
// "/dev/shm could not reserve 1 GiB: no space left on device".
type reserveError struct {
	dir  string
	size int64
	err  error
}

func (e *reserveError) Error() string {
	return fmt.Sprintf("%s could not reserve %s: %v", e.dir, Human(e.size), e.err)
}

func (e *reserveError) Unwrap() error { return e.err }

// mark links the new segment (still reachable as tmp) as markerPrefix+name.
// A marker left by a dead owner whose segment name was removed is replaced;
// without a marker the segment still works, but if this server dies it is
// cleaned only by a server started with the same name.
func mark(dir, name, tmp string, log *slog.Logger) {
	marker := filepath.Join(dir, markerPrefix+name)
	err := unix.Link(tmp, marker)
	if errors.Is(err, unix.EEXIST) {
		if ok, _ := removeIfStale(marker, os.Geteuid(), nil); ok {
			err = unix.Link(tmp, marker)
		}
	}
	if err != nil {
		log.Warn("shared memory segment left unmarked: if this server dies, only a server started with the same name removes it",
			"segment", name, "marker", marker, "err", err)
	}
}

func openAnon(o Options, dec Decision, log *slog.Logger) (*Segment, error) {
	mem, err := unix.Mmap(-1, 0, int(o.Size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("map %s of private memory: %w", Human(o.Size), err)
	}
	s := &Segment{dec: dec, mem: mem, fd: -1, done: make(chan struct{}), log: log}
	s.startPrefault(o.Prefault)
	return s, nil
}

// Decision says which memory backs the segment and why.
func (s *Segment) Decision() Decision { return s.dec }

// Bytes is the whole mapping; nil after Close.
func (s *Segment) Bytes() []byte { return s.mem }

// Prefaulted is how many bytes the background prefault has populated so far.
func (s *Segment) Prefaulted() int64 { return s.faulted.Load() }

// Close stops the prefault, unmaps, unlinks the segment name (if it still
// names this segment) and releases the flock. Later calls do nothing.
func (s *Segment) Close() error {
	var err error
	s.once.Do(func() {
		s.stop.Store(true)
		<-s.done
		if e := unix.Munmap(s.mem); e != nil {
			err = fmt.Errorf("unmap pool: %w", e)
		}
		s.mem = nil
		if s.fd < 0 {
			return
		}
		for _, name := range []string{s.dec.Segment, markerPrefix + s.dec.Segment} {
			path := filepath.Join(s.dir, name)
			if e := unlinkIfSame(s.fd, path); e != nil && err == nil {
				err = fmt.Errorf("unlink %s: %w", path, e)
			}
		}
		unix.Close(s.fd) // releases the flock
		s.fd = -1
	})
	return err
}

const prefaultStep = 64 << 20

// startPrefault populates the pages in the background so that start-up does
// not wait (first touch costs ~15 µs per 4 KiB page). MADV_POPULATE_WRITE
// never changes contents, so it is safe while workers already write; on
// kernels without it, an atomic add of zero per page does the same.
func (s *Segment) startPrefault(on bool) {
	if !on {
		close(s.done)
		return
	}
	go func() {
		defer close(s.done)
		page := os.Getpagesize()
		madvise := true
		for off := 0; off < len(s.mem) && !s.stop.Load(); off += prefaultStep {
			end := min(off+prefaultStep, len(s.mem))
			if madvise && unix.Madvise(s.mem[off:end], unix.MADV_POPULATE_WRITE) != nil {
				madvise = false
			}
			if !madvise {
				for p := off; p+4 <= end; p += page {
					atomic.AddUint32((*uint32)(unsafe.Pointer(&s.mem[p])), 0)
				}
			}
			s.faulted.Store(int64(end))
		}
	}()
}

// CleanStale removes stale segments from dir and returns the names of the
// segments removed. Stale means the flock can be taken (no live kvdock holds
// it) and the file is provably one we may remove:
//
//   - want, the name about to be created (normalised; "" for none), whoever
//     created it: the operator asked for that name;
//   - a segment of another name only with kvdock's marker link and owned by
//     our uid. Python LMCache never takes the flock, so an unmarked segment
//     is unlocked while its server lives, and another user's segment is not
//     ours to remove even when we are root;
//   - a marker whose segment is gone, and a crash leftover of a segment being
//     created (tmpPrefix, older than a minute), both ours by uid.
//
// Each file is unlinked only while its flock is held and after its path is
// checked to still name the locked inode, so a segment that a starting
// server has just put in its place is never removed.
func CleanStale(dir, want string, log *slog.Logger) ([]string, error) {
	c := cleaner{dir: dir, want: want, uid: os.Geteuid(), log: log}
	return c.run()
}

type cleaner struct {
	dir  string
	want string
	uid  int
	log  *slog.Logger
	// afterLock runs once a candidate's flock is held, before its path is
	// checked; tests use it to replace the file under the cleaner.
	afterLock func(path string)
}

func (c cleaner) run() ([]string, error) {
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, fmt.Errorf("scan %s for stale segments: %w", c.dir, err)
	}
	var removed []string
	var errs []error
	note := func(name string, ok bool, err error) {
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			c.log.Info("removed stale shared memory segment", "segment", name, "dir", c.dir)
			removed = append(removed, name)
		}
	}
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() {
			continue
		}
		switch {
		case strings.HasPrefix(name, markerPrefix):
			seg := strings.TrimPrefix(name, markerPrefix)
			ok, err := c.removeMarked(seg)
			note(seg, ok, err)
		case strings.HasPrefix(name, tmpPrefix):
			// A segment being created is locked within microseconds; only
			// leftovers of a crash are old.
			if info, err := e.Info(); err != nil || time.Since(info.ModTime()) < time.Minute {
				continue
			}
			_, err := removeIfStale(filepath.Join(c.dir, name), c.uid, c.afterLock)
			note(name, false, err)
		}
	}
	if c.want != "" && !slices.Contains(removed, c.want) {
		ok, err := c.removeWanted()
		note(c.want, ok, err)
	}
	return removed, errors.Join(errs...)
}

// removeMarked removes seg and its marker when the marker is ours by uid and
// unlocked; seg goes only if it is the marker's inode.
func (c cleaner) removeMarked(seg string) (bool, error) {
	marker := filepath.Join(c.dir, markerPrefix+seg)
	fd, ok, err := lockIfStale(marker, c.uid)
	if !ok {
		return false, err
	}
	defer unix.Close(fd)
	if c.afterLock != nil {
		c.afterLock(marker)
	}
	// The marker is the segment's inode: if seg still names it, seg is the
	// dead owner's segment. A marker whose segment name is gone still pinned
	// the memory; it goes too, but no segment is reported.
	path := filepath.Join(c.dir, seg)
	segGone := false
	if strings.HasPrefix(seg, Prefix) && sameFile(fd, path) {
		if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
			return false, fmt.Errorf("remove stale %s: %w", path, err)
		}
		segGone = true
	}
	if err := unlinkIfSame(fd, marker); err != nil {
		return false, fmt.Errorf("remove stale %s: %w", marker, err)
	}
	return segGone, nil
}

// removeWanted removes the requested name, whoever owns it, if its flock can
// be taken, with its marker if it has one (another user's marker would
// otherwise keep the old segment's memory).
func (c cleaner) removeWanted() (bool, error) {
	path := filepath.Join(c.dir, c.want)
	fd, ok, err := lockIfStale(path, -1)
	if !ok {
		return false, err
	}
	defer unix.Close(fd)
	if c.afterLock != nil {
		c.afterLock(path)
	}
	if !sameFile(fd, path) {
		return false, nil // replaced since we opened it: not the file we locked
	}
	for _, p := range []string{path, filepath.Join(c.dir, markerPrefix+c.want)} {
		if err := unlinkIfSame(fd, p); err != nil {
			return false, fmt.Errorf("remove stale %s: %w", p, err)
		}
	}
	return true, nil
}

// removeIfStale unlinks path if its flock can be taken, it is owned by uid
// (-1: any owner) and path still names the locked inode when it is removed.
func removeIfStale(path string, uid int, afterLock func(string)) (bool, error) {
	fd, ok, err := lockIfStale(path, uid)
	if !ok {
		return false, err
	}
	defer unix.Close(fd)
	if afterLock != nil {
		afterLock(path)
	}
	if !sameFile(fd, path) {
		return false, nil // replaced since we opened it: not the file we locked
	}
	if err := unlinkIfSame(fd, path); err != nil {
		return false, fmt.Errorf("remove stale %s: %w", path, err)
	}
	return true, nil
}

// lockIfStale opens path and takes its flock without blocking; ok is true,
// with the descriptor holding the lock, when the lock was free and the file
// is a regular file owned by uid (-1: any owner).
func lockIfStale(path string, uid int) (fd int, ok bool, err error) {
	// O_NONBLOCK: a FIFO swapped in under the name must not block the open.
	fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return -1, false, nil
		}
		return -1, false, fmt.Errorf("open %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, false, fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || uid >= 0 && int(st.Uid) != uid {
		unix.Close(fd)
		return -1, false, nil
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return -1, false, nil // live owner
		}
		return -1, false, fmt.Errorf("lock %s: %w", path, err)
	}
	return fd, true, nil
}

// sameFile reports whether path names the inode open as fd.
func sameFile(fd int, path string) bool {
	var mine, named unix.Stat_t
	return unix.Fstat(fd, &mine) == nil && unix.Lstat(path, &named) == nil &&
		mine.Dev == named.Dev && mine.Ino == named.Ino
}

// unlinkIfSame unlinks path if it names the inode open as fd. The caller
// holds that inode's flock, so no kvdock can remove it and link a new
// segment under the name between the check and the unlink.
func unlinkIfSame(fd int, path string) error {
	if !sameFile(fd, path) {
		return nil
	}
	if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

func statfsFree(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// Human formats a byte count in binary units: "60 MiB", "1 GiB", "1.5 GiB".
func Human(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	v := float64(n)
	u := 0
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	s := fmt.Sprintf("%.1f", v)
	s = strings.TrimSuffix(s, ".0")
	return s + " " + units[u]
}
