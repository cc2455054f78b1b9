package segment

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Identity names one segment file beyond its name, so that a successor can
// tell the segment it was handed from another file put under that name.
type Identity struct {
	Name     string
	Dev, Ino uint64
	Size     int64
	UID      uint32
}

// Keep ends the segment like Close but leaves the file for a successor
// (a restarted kvdock that adopts it). record is called with the segment's
// identity while this process still holds the flock; only when it succeeds
// is the segment kept: it is unmapped and its flock released. Its kvdock
// marker stays, so a kvdock that starts and does not adopt it removes it as
// stale: a kept pool nobody adopts does not hold the host's memory. When record fails, or the memory is anonymous,
// the segment is closed as by Close and the error returned.
func (s *Segment) Keep(record func(Identity) error) error {
	if s.fd < 0 {
		if err := s.Close(); err != nil {
			return err
		}
		return errors.New("segment: anonymous memory cannot be kept")
	}
	var st unix.Stat_t
	if err := unix.Fstat(s.fd, &st); err != nil {
		_ = s.Close()
		return fmt.Errorf("segment: stat %s to keep it: %w", s.name, err)
	}
	id := Identity{Name: s.name, Dev: st.Dev, Ino: st.Ino, Size: st.Size, UID: st.Uid}
	if err := record(id); err != nil {
		if cerr := s.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return err
	}
	// The kept marker replaces the kvdock marker: other kvdocks' cleanup
	// leaves the segment to its successor for keptGrace, then removes it.
	path := filepath.Join(s.dir, s.name)
	kept := filepath.Join(s.dir, keptPrefix+s.name)
	var errs []error
	if err := unix.Link(path, kept); err != nil && !errors.Is(err, unix.EEXIST) {
		errs = append(errs, fmt.Errorf("mark %s kept: %w", s.name, err))
	}
	if err := unlinkOwn(s.fd, filepath.Join(s.dir, markerPrefix+s.name)); err != nil {
		errs = append(errs, fmt.Errorf("unlink marker of kept segment %s: %w", s.name, err))
	}
	errs = append(errs, s.end(false))
	return errors.Join(errs...)
}

// ErrNotAdoptable means a kept segment is not the one recorded, or not
// ours to adopt; the error says what differs.
var ErrNotAdoptable = errors.New("kept segment not adoptable")

// Adopt maps the kept segment id in dir ("" = DefaultDir) instead of
// creating one, shared or private as its name says (a private segment is
// adopted private: never Shared): the file must be a regular file of our uid, mode 0600,
// the recorded inode with the recorded size (the pool size, size), and
// no live process may hold its flock. It takes the flock for life and puts
// the kvdock marker back; its pages were reserved by its creator. The
// reason prints the size with bytes (as Options.Bytes). The error wraps
// ErrBusy (held by a live process) or ErrNotAdoptable.
func Adopt(dir string, id Identity, size int64, prefault bool, log *slog.Logger, bytes func(int64) string) (*Segment, error) {
	if dir == "" {
		dir = DefaultDir
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := ValidName(id.Name); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotAdoptable, err)
	}
	if size <= 0 || id.Size != size {
		return nil, fmt.Errorf("%w: segment %s was kept with %d bytes, the pool needs %d", ErrNotAdoptable, id.Name, id.Size, size)
	}
	path := filepath.Join(dir, id.Name)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: open %s: %v", ErrNotAdoptable, path, err)
	}
	fail := func(err error) (*Segment, error) {
		unix.Close(fd)
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(fmt.Errorf("%w: stat %s: %v", ErrNotAdoptable, path, err))
	}
	switch uid := uint32(os.Geteuid()); {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fail(fmt.Errorf("%w: %s is not a regular file", ErrNotAdoptable, path))
	case st.Uid != uid || id.UID != uid:
		return fail(fmt.Errorf("%w: %s is owned by uid %d (recorded %d), this server runs as %d", ErrNotAdoptable, path, st.Uid, id.UID, uid))
	case st.Mode&0o077 != 0:
		return fail(fmt.Errorf("%w: %s has mode %#o, want 0600", ErrNotAdoptable, path, st.Mode&0o777))
	case st.Dev != id.Dev || st.Ino != id.Ino:
		return fail(fmt.Errorf("%w: %s is inode %d:%d, the recorded segment was %d:%d (replaced since)", ErrNotAdoptable, path, st.Dev, st.Ino, id.Dev, id.Ino))
	case st.Size != size:
		return fail(fmt.Errorf("%w: %s has %d bytes, the pool needs %d", ErrNotAdoptable, path, st.Size, size))
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fail(fmt.Errorf("segment %s in %s: %w", id.Name, dir, ErrBusy))
		}
		return fail(fmt.Errorf("%w: lock %s: %v", ErrNotAdoptable, path, err))
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("map %s: %w", path, err))
	}
	c := cleaner{dir: dir, want: id.Name, uid: int(st.Uid), log: log}
	mark(c, path, log)
	_ = unlinkOwn(fd, filepath.Join(dir, keptPrefix+id.Name))
	dec := Decision{Segment: id.Name, Size: size, Shared: true, Reason: fmt.Sprintf("segment %s adopted from the previous process, %s", id.Name, bytesText(bytes, size))}
	if IsPrivate(id.Name) {
		// Adopted as it was kept: a private segment stays unadvertised.
		dec = Decision{Private: id.Name, Size: size,
			Reason: fmt.Sprintf("private segment %s adopted from the previous process, %s, never advertised", id.Name, bytesText(bytes, size))}
	}
	s := &Segment{
		dec:  dec,
		name: id.Name,
		dir:  dir,
		mem:  mem,
		fd:   fd,
		done: make(chan struct{}),
		log:  log,
	}
	s.startPrefault(prefault)
	log.Info("shared memory segment adopted", "segment", id.Name, "dir", dir, "bytes", size, "private", IsPrivate(id.Name))
	return s, nil
}

// RemoveKept removes a kept segment that will not be adopted: only when
// path still names the recorded inode, it is a regular file of ours and no
// live process holds its flock. It reports whether it was removed.
func RemoveKept(dir string, id Identity) (bool, error) {
	if dir == "" {
		dir = DefaultDir
	}
	if ValidName(id.Name) != nil {
		return false, nil
	}
	c := cleaner{dir: dir, want: id.Name, uid: os.Geteuid()}
	path := filepath.Join(dir, id.Name)
	v, err := c.examine(path)
	if err != nil || v.state != stale {
		return false, err
	}
	defer unix.Close(v.fd)
	var st unix.Stat_t
	if unix.Fstat(v.fd, &st) != nil || st.Dev != id.Dev || st.Ino != id.Ino {
		return false, nil
	}
	gone, err := unlinkStale(v.fd, path, filepath.Join(dir, markerPrefix+id.Name), filepath.Join(dir, keptPrefix+id.Name))
	return gone[0], err
}
