// Package segment maps the memory behind the L1 pool: a named POSIX
// shared-memory segment that workers attach by name (zero-copy transfers); a
// private segment, made and held the same way but never advertised, when
// shared memory is off (pickle mode), so that a restart can keep the pool
// all the same; or anonymous memory when neither can be made (no room in the
// shm directory, a lazy pool), whose restarts are cold.
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
// requested name if it is a regular file of our uid whose flock is free, and
// kvdock-marked segments of our uid whose flock is free (their owner died).
// A segment whose flock is held is never touched, nor another user's file
// (even by root), nor a symbolic link or other non-regular file: at the
// requested name these make Open fail with ErrBusy or ErrForeign and a
// reason that says which. The protocol is race-free between kvdocks starting
// and cleaning at once; CleanStale says how.
package segment

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Prefix starts every shared pool segment name; stale cleanup only looks at
// these and at PrivatePrefix.
const Prefix = "lmcache_l1_pool_"

// PrivatePrefix starts the name of a private segment: the pool of a server
// whose shared memory is off, in the shm directory only so that a restart
// can keep it. It is never advertised, and no name a worker is told (always
// Prefix + something) can be one.
const PrivatePrefix = "kvdock_private_pool_"

// PrivateName is the private segment of the server at host:port run by
// this user: one per endpoint, so that the same command line started again
// plans the segment it kept, and the uid keeps two users' names apart.
func PrivateName(host string, port int) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(host))
	return fmt.Sprintf("%s%d_%d_%08x", PrivatePrefix, os.Geteuid(), port, h.Sum32())
}

// IsPrivate reports whether name is a private segment's (PrivatePrefix).
func IsPrivate(name string) bool { return strings.HasPrefix(name, PrivatePrefix) }

// DefaultDir is where shm_open places segments on Linux.
const DefaultDir = "/dev/shm"

// tmpPrefix names a segment being created: it is flocked before it is
// linked under its real name, so a live segment is never visible unlocked.
const tmpPrefix = ".kvdock-new-"

// markerPrefix names the second link of a kvdock segment, markerPrefix+name:
// the same inode as name, proof that kvdock created it and holds its flock
// while alive.
const markerPrefix = ".kvdock-seg-"

// keptPrefix names the marker of a segment kept for a successor (Keep).
// Other kvdocks' cleanup spares it for keptGrace after it was kept (the
// restart's gap), then removes it as stale: a kept pool nobody adopts does
// not hold the host's memory.
const (
	keptPrefix = ".kvdock-kept-"
	keptGrace  = 2 * time.Minute
)

// ErrBusy means the requested segment name is held by a live process.
var ErrBusy = errors.New("shared memory segment is held by a live process")

// ErrForeign means the requested segment name is taken by something kvdock
// may not remove: another user's file, a symbolic link, any non-regular file.
var ErrForeign = errors.New("kvdock removes only stale segments of its own user")

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
// Prefix (or PrivatePrefix) followed by [A-Za-z0-9_.-], at most 255 bytes.
func ValidName(name string) error {
	prefix := Prefix
	if IsPrivate(name) {
		prefix = PrivatePrefix
	}
	if len(name) > 255 || len(name) <= len(prefix) || !strings.HasPrefix(name, prefix) {
		return fmt.Errorf("segment name %q: want %s followed by 1–%d characters", name, prefix, 255-len(prefix))
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
	// Name is the shared segment's name, normalised with NormalizeName; ""
	// means the memory is not shared: the private segment Private, or
	// anonymous memory.
	Name string
	// Private, when Name is "", is the private segment to make
	// (PrivateName): a file like a shared segment that is never
	// advertised. When it cannot be made the memory is anonymous, with the
	// reason; that is never an error. "" means anonymous memory.
	Private string
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
	// Bytes prints a size in the Decision reasons: the engine passes the
	// one byte formatter (settings.BytesText), which this leaf may not
	// import; nil prints the count of bytes.
	Bytes func(n int64) string
	// afterLock runs whenever the cleanup holds a candidate's lock; tests
	// use it to yield there, widening the windows a race needs.
	afterLock func(path string)
}

// bytes prints n as o.Bytes does (the count of bytes without it).
func (o Options) bytes(n int64) string { return bytesText(o.Bytes, n) }

func bytesText(f func(int64) string, n int64) string {
	if f != nil {
		return f(n)
	}
	return fmt.Sprintf("%d bytes", n)
}

// Decision says which memory backs the pool and why. It is first the plan
// made from the settings (Segment to create, or else Private, "" for both =
// anonymous memory, and Reason; the rest zero), then, as Segment.Decision,
// the outcome of Open: the shared segment exists and Shared is set, or the
// private segment exists, or the memory is anonymous with the plan's reason
// or the fallback's (capacity check, reservation failure).
type Decision struct {
	Segment string // shared segment name, the one workers are told; "" when not shared
	// Private is the private segment behind a pool that is not shared
	// (never advertised); "" with Segment "" means anonymous memory.
	Private string
	Size    int64  // bytes mapped
	Shared  bool   // workers can attach Segment
	Reason  string // human sentence for logs, /status and the dashboard
	ShmFree int64  // free bytes in the shm directory when checked; 0 if not checked
}

// File is the name of the file in the shm directory behind the pool (the
// shared segment, else the private one), the one a restart keeps; "" for
// anonymous memory, which a restart cannot keep.
func (d Decision) File() string {
	if d.Segment != "" {
		return d.Segment
	}
	return d.Private
}

// coldSuffix ends the reason of every pool in anonymous memory: nothing of
// it can outlive the process.
const coldSuffix = "; restarts of this pool are cold"

// Segment is one mapped region.
type Segment struct {
	dec     Decision
	name    string // the file in dir (shared or private); "" when anonymous
	dir     string
	mem     []byte
	fd      int // -1 when anonymous
	stop    atomic.Bool
	done    chan struct{}
	faulted atomic.Int64
	once    sync.Once
	log     *slog.Logger
}

// Open maps the memory described by o. A shared name held by a live
// process is an error wrapping ErrBusy, one taken by a file kvdock may not
// remove (another user's, a symbolic link) an error wrapping ErrForeign; a
// pool that does not fit in the shm directory, a segment that cannot be
// created or whose pages cannot be reserved (the directory filled up since
// it was checked) falls back to anonymous memory with the reason in
// Decision. A private segment (o.Private) falls back to anonymous memory in
// every one of those cases: shared memory is off, so it only spares a
// restart the cold start, and a name squatted by another user must not stop
// the server.
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
		return openPrivate(o, log)
	}
	name := NormalizeName(o.Name)
	if err := ValidName(name); err != nil {
		return nil, err
	}
	s, fallback, removed, err := openFile(o, name, log)
	if err != nil {
		return nil, err
	}
	if s == nil {
		fallback.Size = o.Size
		fallback.Reason += "; using anonymous memory" + coldSuffix
		log.Warn("shared memory off", "reason", fallback.Reason)
		return openAnon(o, fallback, log)
	}
	s.dec.Segment, s.dec.Shared = name, true
	s.dec.Reason = fmt.Sprintf("segment %s created, %s", name, o.bytes(o.Size))
	if removed > 0 {
		s.dec.Reason += fmt.Sprintf(" (removed %d stale segment(s))", removed)
	}
	s.startPrefault(o.Prefault)
	return s, nil
}

// openPrivate maps the memory of a pool that is not shared: the private
// segment o.Private when it can be made, else anonymous memory, the reason
// saying which and why.
func openPrivate(o Options, log *slog.Logger) (*Segment, error) {
	reason := o.NoShmReason
	if reason == "" {
		reason = "shared memory off"
	}
	if o.Private == "" {
		return openAnon(o, Decision{Size: o.Size, Reason: reason + coldSuffix}, log)
	}
	if !IsPrivate(o.Private) || ValidName(o.Private) != nil {
		return nil, fmt.Errorf("segment: private segment name %q: want %s followed by [A-Za-z0-9_.-]", o.Private, PrivatePrefix)
	}
	s, fallback, _, err := openFile(o, o.Private, log)
	if err != nil {
		fallback = Decision{Reason: err.Error()}
	}
	if s == nil {
		d := Decision{Size: o.Size, ShmFree: fallback.ShmFree,
			Reason: fmt.Sprintf("%s; private segment %s not made (%s): anonymous memory%s", reason, o.Private, fallback.Reason, coldSuffix)}
		log.Warn("private segment off", "reason", d.Reason)
		return openAnon(o, d, log)
	}
	s.dec.Private = o.Private
	s.dec.Reason = fmt.Sprintf("%s; the pool is the private segment %s, %s, never advertised (a restart can keep it)", reason, o.Private, o.bytes(o.Size))
	s.startPrefault(o.Prefault)
	return s, nil
}

// openFile makes the segment name in o.Dir after the stale cleanup and
// returns it with how many stale segments were removed, its Decision
// holding Size and ShmFree. When the memory must be anonymous instead it
// returns a nil segment and, in fallback, the reason (free space,
// reservation, creation) and ShmFree. The errors wrap ErrBusy or ErrForeign.
func openFile(o Options, name string, log *slog.Logger) (s *Segment, fallback Decision, removed int, err error) {
	c := cleaner{dir: o.Dir, want: name, uid: os.Geteuid(), log: log, afterLock: o.afterLock}
	gone, err := c.run()
	if err != nil {
		log.Warn("stale shared-memory cleanup incomplete", "dir", o.Dir, "err", err)
	}
	removed = len(gone)
	path := filepath.Join(o.Dir, name)
	if ok, err := c.clearWant(); err != nil {
		return nil, Decision{}, 0, err
	} else if ok {
		log.Info("removed stale shared memory segment", "segment", name, "dir", o.Dir)
		removed++
	}
	free, err := o.Statfs(o.Dir)
	if err != nil {
		return nil, Decision{Reason: fmt.Sprintf("cannot check free space of %s (%v)", o.Dir, err)}, removed, nil
	}
	if o.Size > free {
		return nil, Decision{Reason: fmt.Sprintf("%s has %s free, pool needs %s", o.Dir, o.bytes(free), o.bytes(o.Size)), ShmFree: free}, removed, nil
	}
	s, err = create(o, c, path, free, log)
	if errors.Is(err, ErrBusy) || errors.Is(err, ErrForeign) {
		return nil, Decision{}, 0, err
	}
	var re *reserveError
	if errors.As(err, &re) {
		return nil, Decision{Reason: re.Error(), ShmFree: free}, removed, nil
	}
	if err != nil {
		return nil, Decision{Reason: fmt.Sprintf("cannot create segment %s (%v)", name, err), ShmFree: free}, removed, nil
	}
	return s, Decision{}, removed, nil
}

// create makes the segment under a temporary name, flocked before anything
// else can see it, reserves its pages, then links it as c.want and its marker.
func create(o Options, c cleaner, path string, free int64, log *slog.Logger) (*Segment, error) {
	name := c.want
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
		return fail(&reserveError{dir: o.Dir, size: o.bytes(o.Size), err: err})
	}
	// Something may have taken the name since clearWant: a live server (busy),
	// a file that is not ours (refused with its reason), or a stale segment
	// of ours left by a server that died meanwhile (removed, then retried).
	for attempt := 0; ; attempt++ {
		err := unix.Link(tmp, path)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EEXIST) {
			return fail(fmt.Errorf("publish %s as %s: %w", tmp, path, err))
		}
		if _, err := c.clearWant(); err != nil {
			return fail(err)
		}
		if attempt == 3 {
			return fail(fmt.Errorf("segment %s in %s keeps reappearing while starting: %w", name, o.Dir, ErrBusy))
		}
	}
	mark(c, tmp, log)
	unix.Unlink(tmp)
	mem, err := unix.Mmap(fd, 0, int(o.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unlinkNames(fd, o.Dir, name)
		unix.Close(fd)
		return nil, fmt.Errorf("map %s: %w", path, err)
	}
	log.Info("shared memory segment created", "segment", name, "dir", o.Dir, "bytes", o.Size, "private", IsPrivate(name))
	return &Segment{
		dec:  Decision{Size: o.Size, ShmFree: free},
		name: name,
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
	dir, size string
	err       error
}

func (e *reserveError) Error() string {
	return fmt.Sprintf("%s could not reserve %s: %v", e.dir, e.size, e.err)
}

func (e *reserveError) Unwrap() error { return e.err }

// mark links the new segment (still reachable as tmp) as markerPrefix+name.
// A marker left by a dead owner is replaced; a live owner cannot hold one,
// since owners unlink their marker before their name and we hold the name.
// Without a marker the segment still works, but if this server dies it is
// cleaned only by a server started with the same name.
func mark(c cleaner, tmp string, log *slog.Logger) {
	marker := filepath.Join(c.dir, markerPrefix+c.want)
	var err error
	for attempt := 0; ; attempt++ {
		err = unix.Link(tmp, marker)
		if errors.Is(err, unix.EEXIST) && sameNames(tmp, marker) {
			return // an adopted segment: its marker stayed while it was kept
		}
		if !errors.Is(err, unix.EEXIST) || attempt == 3 {
			break
		}
		if _, rerr := c.removeIfStale(marker); rerr != nil {
			err = rerr
			break
		}
	}
	if err != nil {
		log.Warn("shared memory segment left unmarked: if this server dies, only a server started with the same name removes it",
			"segment", c.want, "marker", marker, "err", err)
	}
}

// sameNames reports whether the names a and b are links to one inode.
func sameNames(a, b string) bool {
	var sa, sb unix.Stat_t
	if unix.Lstat(a, &sa) != nil || unix.Lstat(b, &sb) != nil {
		return false
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

func openAnon(o Options, dec Decision, log *slog.Logger) (*Segment, error) {
	mem, err := unix.Mmap(-1, 0, int(o.Size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("map %s of private memory: %w", o.bytes(o.Size), err)
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
func (s *Segment) Close() error { return s.end(true) }

// end stops the prefault, unmaps and releases the flock, unlinking the
// segment name first when unlink is set (Close; Keep leaves it). Only the
// first call does anything.
func (s *Segment) end(unlink bool) error {
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
		if unlink {
			if e := unlinkNames(s.fd, s.dir, s.name); e != nil && err == nil {
				err = e
			}
		}
		unix.Close(s.fd) // releases the flock
		s.fd = -1
	})
	return err
}

// prefaultStep is how much is faulted in between progress reports.
const prefaultStep = 2 << 20

// startPrefault populates the pages in the background so that start-up does
// not wait (first touch costs ~15 µs per 4 KiB page).
func (s *Segment) startPrefault(on bool) {
	if !on {
		close(s.done)
		return
	}
	go func() {
		defer close(s.done)
		populate(s.mem, prefaultStep, func(end int) bool {
			s.faulted.Store(int64(end))
			return !s.stop.Load()
		})
	}()
}

// populate faults mem in a page at a time, an atomic add of zero to each
// (contents never change, so it is safe while workers already write),
// telling progress the end of each step bytes done; it stops early when
// progress returns false. A page fault locks its own mapping only (kernels
// with per-VMA locks, 6.4 on; before, the memory map lock for one fault).
// MADV_POPULATE_WRITE would hold the process's memory map lock for each
// call, and every mmap meanwhile (a thread's stack when the wire server
// binds, the Go heap growing) would wait for it, in a restart's gap
// (BenchmarkMmapDuringPrefault).
func populate(mem []byte, step int, progress func(end int) bool) {
	page := os.Getpagesize()
	for off := 0; off < len(mem); off += step {
		end := min(off+step, len(mem))
		for p := off; p+4 <= end; p += page {
			atomic.AddUint32((*uint32)(unsafe.Pointer(&mem[p])), 0)
		}
		if !progress(end) {
			return
		}
	}
}

// CleanStale removes stale segments from dir and returns the names of the
// segments removed. Stale means the file is a regular file owned by our uid
// and no live kvdock holds its flock; then it is removed when it is provably
// one we may remove:
//
//   - want, the name about to be created (normalised; "" for none), marker or
//     not: the operator asked for that name. A file of another user there is
//     never removed, even when we are root, nor a symbolic link or any other
//     non-regular file (Open refuses to start and says which it is);
//   - a segment of another name (shared, or a private one of a server
//     that died) only with kvdock's marker link. Python LMCache never takes
//     the flock, so an unmarked segment is unlocked while its server lives;
//   - a marker whose segment is gone, and a crash leftover of a segment being
//     created (tmpPrefix, older than a minute).
//
// The protocol, race-free between any number of kvdocks starting, cleaning
// and stopping at once:
//
//   - a segment's creator takes an exclusive flock on the inode before the
//     inode has any public name and holds it for life; nothing else ever
//     takes an exclusive flock, so an inode once found unlocked stays stale;
//   - a cleaner proves an inode stale with a shared flock, which other
//     cleaners' shared flocks do not refuse: a cleaner at work never makes a
//     stale segment look alive to a starting kvdock;
//   - a cleaner unlinks a name only while it holds the stale inode's
//     open-file-description write lock (fcntl, independent of flock), after
//     checking that the name still names that inode. Every unlink of a
//     stale inode's name happens under that lock, so no name can move from
//     the stale inode to a live segment between the check and the unlink.
func CleanStale(dir, want string, log *slog.Logger) ([]string, error) {
	c := cleaner{dir: dir, want: want, uid: os.Geteuid(), log: log}
	removed, err := c.run()
	if c.want == "" {
		return removed, err
	}
	ok, werr := c.clearWant()
	if ok {
		c.logger().Info("removed stale shared memory segment", "segment", c.want, "dir", c.dir)
		removed = append(removed, c.want)
	}
	return removed, errors.Join(err, werr)
}

type cleaner struct {
	dir  string
	want string
	uid  int
	log  *slog.Logger
	// now is the clock kept markers are judged by (time.Now when nil).
	now func() time.Time
	// afterLock runs once a candidate is proved stale, before its names are
	// checked; tests use it to replace the file under the cleaner or to
	// yield there.
	afterLock func(path string)
}

func (c cleaner) logger() *slog.Logger {
	if c.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.log
}

// run removes the stale marked segments, orphan markers and old leftovers
// of other names; want is handled by clearWant.
func (c cleaner) run() ([]string, error) {
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, fmt.Errorf("scan %s for stale segments: %w", c.dir, err)
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() {
			continue
		}
		switch {
		case strings.HasPrefix(name, markerPrefix), strings.HasPrefix(name, keptPrefix):
			prefix := markerPrefix
			if strings.HasPrefix(name, keptPrefix) {
				prefix = keptPrefix
				if c.keptRecently(name) {
					continue // its successor may be about to adopt it
				}
			}
			seg := strings.TrimPrefix(name, prefix)
			if seg == c.want {
				continue // clearWant decides, and says why it cannot
			}
			ok, err := c.removeMarked(prefix, seg)
			if err != nil {
				errs = append(errs, err)
			}
			if ok {
				c.logger().Info("removed stale shared memory segment", "segment", seg, "dir", c.dir)
				removed = append(removed, seg)
			}
		case strings.HasPrefix(name, tmpPrefix):
			// A segment being created is locked within microseconds; only
			// leftovers of a crash are old.
			if info, err := e.Info(); err != nil || time.Since(info.ModTime()) < time.Minute {
				continue
			}
			if _, err := c.removeIfStale(filepath.Join(c.dir, name)); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return removed, errors.Join(errs...)
}

// keptRecently reports whether the kept marker name was linked (or its
// segment written) within keptGrace: a link sets the inode's change time.
func (c cleaner) keptRecently(name string) bool {
	var st unix.Stat_t
	if unix.Lstat(filepath.Join(c.dir, name), &st) != nil {
		return true // gone or unreadable: nothing to decide now
	}
	return c.withinGrace(&st)
}

// keptBeside reports whether seg has a kept marker linked within
// keptGrace. Keep links it before it unlinks the live server's marker and
// releases the flock, so a cleaner that opened the live marker before that
// unlink and got its lock after the release finds it here, and leaves the
// segment to its successor as it would have found it by the kept marker.
func (c cleaner) keptBeside(seg string) bool {
	var st unix.Stat_t
	if unix.Lstat(filepath.Join(c.dir, keptPrefix+seg), &st) != nil {
		return false
	}
	return c.withinGrace(&st)
}

// withinGrace reports whether st changed within keptGrace.
func (c cleaner) withinGrace(st *unix.Stat_t) bool {
	now := time.Now()
	if c.now != nil {
		now = c.now()
	}
	return now.Sub(time.Unix(st.Ctim.Unix())) < keptGrace
}

// removeMarked removes seg and its marker (prefix+seg) when the marker is a
// stale file of ours; seg goes only if it is the marker's inode.
func (c cleaner) removeMarked(prefix, seg string) (bool, error) {
	marker := filepath.Join(c.dir, prefix+seg)
	v, err := c.examine(marker)
	if err != nil || v.state != stale {
		return false, err
	}
	defer unix.Close(v.fd)
	if prefix == markerPrefix && c.keptBeside(seg) {
		return false, nil // kept while this cleaner looked: its successor's
	}
	// The marker is the segment's inode: if seg still names it, seg is the
	// dead owner's segment. A marker whose segment name is gone still pinned
	// the memory; it goes too, but no segment is reported.
	path := filepath.Join(c.dir, seg)
	names := []string{marker}
	pool := strings.HasPrefix(seg, Prefix) || IsPrivate(seg)
	if pool {
		names = []string{path, marker}
	}
	gone, err := unlinkStale(v.fd, names...)
	return pool && gone[0], err
}

// clearWant makes way for the requested name: nil when nothing is there or
// a stale segment of ours was removed (ok), an error wrapping ErrBusy when a
// live process holds it, an error wrapping ErrForeign (saying what the file
// is) when it is not ours to remove.
func (c cleaner) clearWant() (ok bool, err error) {
	path := filepath.Join(c.dir, c.want)
	v, err := c.examine(path)
	if err != nil {
		return false, err
	}
	switch v.state {
	case gone:
		return false, nil
	case live:
		return false, fmt.Errorf("segment %s in %s: %w; stop that server or choose another --shm-name", c.want, c.dir, ErrBusy)
	case foreign:
		return false, fmt.Errorf("segment %s in %s is %s: %w; remove it or choose another --shm-name", c.want, c.dir, c.describe(&v.st), ErrForeign)
	}
	defer unix.Close(v.fd)
	// Its marker goes with it, if it has one: another marker would keep the
	// old segment's memory.
	gone, err := unlinkStale(v.fd, path, filepath.Join(c.dir, markerPrefix+c.want), filepath.Join(c.dir, keptPrefix+c.want))
	return gone[0], err
}

// removeIfStale unlinks path if it is a stale file of ours and path still
// names it when it is removed.
func (c cleaner) removeIfStale(path string) (bool, error) {
	v, err := c.examine(path)
	if err != nil || v.state != stale {
		return false, err
	}
	defer unix.Close(v.fd)
	gone, err := unlinkStale(v.fd, path)
	return gone[0], err
}

// state is what examine found at a path.
type state int

const (
	gone    state = iota // nothing there
	stale                // a regular file of ours that no live kvdock holds
	live                 // a regular file of ours whose flock a live process holds
	foreign              // anything else: not ours to remove
)

// verdict is examine's answer; fd is open (the caller closes it) only when
// state is stale, and holds a shared flock.
type verdict struct {
	state state
	fd    int
	st    unix.Stat_t // foreign: what describe words for the error
}

// examine opens path without following a symbolic link (or blocking on a
// FIFO) and says what it is. It is opened for writing because unlinkStale
// takes a write lock on it; a file of another user is never written.
func (c cleaner) examine(path string) (verdict, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return verdict{state: gone}, nil
		}
		// A symbolic link (ELOOP), a directory (EISDIR), a socket (ENXIO)
		// or another user's file we cannot write (EACCES): say what it is.
		var st unix.Stat_t
		if lerr := unix.Lstat(path, &st); lerr == nil && !c.ours(&st) {
			return verdict{state: foreign, st: st}, nil
		}
		return verdict{}, fmt.Errorf("open %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return verdict{}, fmt.Errorf("stat %s: %w", path, err)
	}
	if !c.ours(&st) {
		unix.Close(fd)
		return verdict{state: foreign, st: st}, nil
	}
	// Shared: owners hold the only exclusive flocks, so this fails exactly
	// when a live owner holds the file, never because another cleaner looks.
	if err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return verdict{state: live}, nil
		}
		return verdict{}, fmt.Errorf("lock %s: %w", path, err)
	}
	if c.afterLock != nil {
		c.afterLock(path)
	}
	return verdict{state: stale, fd: fd}, nil
}

// ours reports whether st is a regular file owned by our uid.
func (c cleaner) ours(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFREG && int(st.Uid) == c.uid
}

// describe says why a file is not a segment kvdock may remove: not a
// regular file, or another user's.
func (c cleaner) describe(st *unix.Stat_t) string {
	var kind string
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return fmt.Sprintf("a file owned by uid %d%s, not by this server's uid %d", st.Uid, userName(st.Uid), c.uid)
	case unix.S_IFLNK:
		kind = "a symbolic link (not followed)"
	case unix.S_IFDIR:
		kind = "a directory"
	case unix.S_IFIFO:
		kind = "a named pipe"
	case unix.S_IFSOCK:
		kind = "a socket"
	default:
		kind = "a device file"
	}
	return kind + ", not a shared memory segment"
}

// userName is " (name)" for a uid the user database knows, else "".
func userName(uid uint32) string {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return ""
	}
	return " (" + u.Username + ")"
}

// unlinkStale removes each of paths that still names the stale inode open as
// fd, holding the inode's write lock (F_OFD_SETLKW) across each check and
// unlink. Only cleaners take that lock, only on inodes proved stale, for a
// few system calls and never while waiting for another lock, so the wait is
// short and cannot deadlock. gone[i] reports whether paths[i] was removed.
func unlinkStale(fd int, paths ...string) (gone []bool, err error) {
	gone = make([]bool, len(paths))
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 0}
	for {
		err = unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLKW, &lk)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return gone, fmt.Errorf("lock stale %s for removal: %w", paths[0], err)
	}
	defer func() {
		lk.Type = unix.F_UNLCK
		unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk)
	}()
	for i, p := range paths {
		if !sameFile(fd, p) {
			continue
		}
		if err := unix.Unlink(p); err != nil && !errors.Is(err, unix.ENOENT) {
			return gone, fmt.Errorf("remove stale %s: %w", p, err)
		}
		gone[i] = true
	}
	return gone, nil
}

// sameFile reports whether path names the inode open as fd.
func sameFile(fd int, path string) bool {
	var mine, named unix.Stat_t
	return unix.Fstat(fd, &mine) == nil && unix.Lstat(path, &named) == nil &&
		mine.Dev == named.Dev && mine.Ino == named.Ino
}

// unlinkNames removes a live segment's names, the marker first: a marker
// then never outlives its owner's name, so a server that has just linked the
// name finds no live marker in the way of its own.
func unlinkNames(fd int, dir, name string) error {
	var errs []error
	for _, p := range []string{filepath.Join(dir, markerPrefix+name), filepath.Join(dir, name)} {
		if err := unlinkOwn(fd, p); err != nil {
			errs = append(errs, fmt.Errorf("unlink %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// unlinkOwn unlinks path if it names the inode open as fd, whose exclusive
// flock the caller holds: no cleaner touches a name of a live inode, so the
// name cannot change between the check and the unlink.
func unlinkOwn(fd int, path string) error {
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
