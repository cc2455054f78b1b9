package restart

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// FileName is the record file of the wire server at host:port in the state
// directory: one per endpoint, since a pool named by the pid
// (lmcache_l1_pool_<pid>) has no name that outlives its process.
func FileName(host string, port int) string {
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			return r
		}
		return '_'
	}, host)
	if len(clean) > 128 {
		clean = clean[:128]
	}
	return "l1-pool-" + clean + "-" + strconv.Itoa(port) + ".state"
}

// openDir opens dir, which must be a real directory (not a symbolic link)
// owned by our user and writable by nobody else; with create it is made
// (mode 0700, parents 0700) when missing, and an existing one of ours is
// narrowed to 0700. The caller closes the descriptor.
func openDir(dir string, create bool) (int, error) {
	if !filepath.IsAbs(dir) {
		return -1, fmt.Errorf("state directory %q: want an absolute path", dir)
	}
	if create {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return -1, fmt.Errorf("state directory: %w", err)
		}
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return -1, fmt.Errorf("%w: state directory %s is a symbolic link or not a directory", ErrInvalid, dir)
		}
		return -1, fmt.Errorf("state directory %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("state directory %s: %w", dir, err)
	}
	uid := uint32(os.Geteuid())
	switch {
	case st.Uid != uid:
		unix.Close(fd)
		return -1, fmt.Errorf("%w: state directory %s is owned by uid %d, this server runs as %d", ErrInvalid, dir, st.Uid, uid)
	case st.Mode&0o022 != 0:
		unix.Close(fd)
		return -1, fmt.Errorf("%w: state directory %s has mode %#o: others may write it (want 0700)", ErrInvalid, dir, st.Mode&0o777)
	case create && st.Mode&0o777 != 0o700:
		if err := unix.Fchmod(fd, 0o700); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("state directory %s: chmod 0700: %w", dir, err)
		}
	}
	return fd, nil
}

// Write records r as dir/file, atomically (a temporary file of mode 0600
// renamed over the name).
func Write(dir, file string, r Record) error {
	data, err := Encode(r)
	if err != nil {
		return err
	}
	return WriteFile(dir, file, data)
}

// WriteFile writes data to dir/file as Write writes a record: the state
// directory checked (or made 0700), a temporary file of mode 0600 renamed
// into place (Create, Pending.Commit).
func WriteFile(dir, file string, data []byte) error {
	f, err := Create(dir, file)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Abort()
		return err
	}
	return f.Commit()
}

// Pending is a state file being written: its bytes go to a temporary file
// of mode 0600 in the state directory, which Commit renames into place
// and Abort removes, so a reader never finds a part of it. Nothing is
// synced to the disk: the files describe a segment in memory, which a
// power loss or a kernel crash takes with it (the next start then finds
// no segment and starts cold, whatever the record), while the page cache
// outlives the process that wrote them. A sync of the tens of MiB a large
// pool's record and its event descriptions take would wait for the disk
// inside the restart's gap, which a worker waits out for 2 s at most.
type Pending struct {
	dfd       int
	f         *os.File
	dir, file string
	tmp       string
}

// Create starts dir/file: the state directory checked (or made 0700) and
// its temporary file created.
func Create(dir, file string) (*Pending, error) {
	dfd, err := openDir(dir, true)
	if err != nil {
		return nil, err
	}
	tmp := "." + file + ".tmp-" + strconv.Itoa(os.Getpid())
	_ = unix.Unlinkat(dfd, tmp, 0)
	fd, err := unix.Openat(dfd, tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		unix.Close(dfd)
		return nil, fmt.Errorf("state file %s: %w", filepath.Join(dir, tmp), err)
	}
	p := &Pending{dfd: dfd, f: os.NewFile(uintptr(fd), filepath.Join(dir, tmp)), dir: dir, file: file, tmp: tmp}
	if err := p.f.Chmod(0o600); err != nil {
		p.Abort()
		return nil, fmt.Errorf("state file %s: %w", filepath.Join(dir, file), err)
	}
	return p, nil
}

// Write appends b to the file.
func (p *Pending) Write(b []byte) (int, error) {
	n, err := p.f.Write(b)
	if err != nil {
		return n, fmt.Errorf("state file %s: %w", filepath.Join(p.dir, p.file), err)
	}
	return n, nil
}

// Commit puts the file in place under its name.
func (p *Pending) Commit() error {
	defer unix.Close(p.dfd)
	fail := func(err error) error {
		_ = unix.Unlinkat(p.dfd, p.tmp, 0)
		return fmt.Errorf("state file %s: %w", filepath.Join(p.dir, p.file), err)
	}
	if err := p.f.Close(); err != nil {
		return fail(err)
	}
	if err := unix.Renameat(p.dfd, p.tmp, p.dfd, p.file); err != nil {
		return fail(err)
	}
	return nil
}

// Abort removes the file; nothing is put in place.
func (p *Pending) Abort() {
	_ = p.f.Close()
	_ = unix.Unlinkat(p.dfd, p.tmp, 0)
	unix.Close(p.dfd)
}

// ErrNone means there is no record to take.
var ErrNone = errors.New("no restart record")

// Take reads dir/file, removes it (a record is used once, adopted or not)
// and returns it validated in full. No file is ErrNone; a file that is not
// a regular file of ours with mode 0600, in a directory of ours no one else
// writes, or whose contents fail Decode, is removed too when it can be and
// refused with an error wrapping ErrInvalid.
func Take(dir, file string) (Record, error) {
	data, err := TakeFile(dir, file, MaxFileBytes)
	if err != nil {
		return Record{}, err
	}
	r, err := Decode(data)
	if err != nil {
		return Record{}, fmt.Errorf("%s: %w", filepath.Join(dir, file), err)
	}
	return r, nil
}

// TakeFile reads dir/file and removes it, as Take does a record's: no file
// is ErrNone; a file that is not a regular file of ours with mode 0600, in
// a directory of ours no one else writes, or longer than limit bytes, is
// removed too when it can be and refused with an error wrapping ErrInvalid.
func TakeFile(dir, file string, limit int64) ([]byte, error) {
	dfd, err := openDir(dir, false)
	if errors.Is(err, unix.ENOENT) {
		return nil, ErrNone
	}
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	path := filepath.Join(dir, file)
	fd, err := unix.Openat(dfd, file, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, ErrNone
	}
	// Whatever was found under the name is spent, whether it is used or not.
	consume := func() { _ = unix.Unlinkat(dfd, file, 0) }
	if err != nil {
		consume()
		if errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("%w: %s is a symbolic link", ErrInvalid, path)
		}
		return nil, fmt.Errorf("%w: open %s: %v", ErrInvalid, path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	defer consume()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("%w: stat %s: %v", ErrInvalid, path, err)
	}
	uid := uint32(os.Geteuid())
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrInvalid, path)
	case st.Uid != uid:
		return nil, fmt.Errorf("%w: %s is owned by uid %d, this server runs as %d", ErrInvalid, path, st.Uid, uid)
	case st.Mode&0o077 != 0:
		return nil, fmt.Errorf("%w: %s has mode %#o, want 0600", ErrInvalid, path, st.Mode&0o777)
	case st.Size > limit:
		return nil, fmt.Errorf("%w: %s has %d bytes, more than the bound of %d", ErrInvalid, path, st.Size, limit)
	}
	// Read into one buffer of the size stat gave, and one byte more to
	// see a file that grew: io.ReadAll grows its buffer a quarter at a
	// time, which for a 9 MB record copies it some twenty times into
	// fresh memory, in the restart's gap.
	data := make([]byte, st.Size+1)
	n, err := io.ReadFull(f, data)
	switch {
	case err == nil:
		return nil, fmt.Errorf("%w: %s grew past its %d bytes while read", ErrInvalid, path, st.Size)
	case !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF):
		return nil, fmt.Errorf("%w: read %s: %v", ErrInvalid, path, err)
	}
	return data[:n], nil
}

// ErrStarting means another process holds the start lock of the endpoint
// (Lock): it is taking the record, opening the pool and binding.
var ErrStarting = errors.New("another kvdock is starting on this endpoint")

// StartLock is a held start lock (Lock).
type StartLock struct {
	dfd, fd int
	name    string
}

// Lock takes the start lock of the record dir/file: an exclusive flock on
// dir/l1-pool-<endpoint>.lock, which a start holds from before it takes
// the record until its wire server is bound (or its start failed). Two
// kvdocks started at once on one endpoint then cannot both act on the kept
// pool: one takes the record and adopts the segment, while the other,
// refused here at once, could otherwise find no record and remove the
// kept segment as stale, or bind first and make the adopter fail. A lock
// held by another process is an error wrapping ErrStarting that names the
// holder's pid. A directory that does not exist holds no record: nil lock
// and nil error (Release of nil does nothing). Other errors say why the
// lock could not be taken at all (a directory that is not ours).
func Lock(dir, file string) (*StartLock, error) {
	dfd, err := openDir(dir, false)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	name := strings.TrimSuffix(file, ".state") + ".lock"
	path := filepath.Join(dir, name)
	// The holder unlinks the file when it lets go: a start that opened it
	// just before then locks an inode no longer under the name, and tries
	// again with the new one.
	for attempt := 0; attempt < 8; attempt++ {
		fd, err := unix.Openat(dfd, name, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
		if err != nil {
			unix.Close(dfd)
			return nil, fmt.Errorf("start lock %s: %w", path, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != uint32(os.Geteuid()) {
			unix.Close(fd)
			unix.Close(dfd)
			return nil, fmt.Errorf("%w: start lock %s is not a regular file of ours", ErrInvalid, path)
		}
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			holder := lockHolder(fd)
			unix.Close(fd)
			unix.Close(dfd)
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("%w (pid %s holds %s)", ErrStarting, holder, path)
			}
			return nil, fmt.Errorf("start lock %s: %w", path, err)
		}
		var named unix.Stat_t
		if unix.Fstatat(dfd, name, &named, unix.AT_SYMLINK_NOFOLLOW) != nil || named.Dev != st.Dev || named.Ino != st.Ino {
			unix.Close(fd)
			continue
		}
		pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
		if err := unix.Ftruncate(fd, 0); err == nil {
			_, _ = unix.Pwrite(fd, pid, 0)
		}
		return &StartLock{dfd: dfd, fd: fd, name: name}, nil
	}
	unix.Close(dfd)
	return nil, fmt.Errorf("start lock %s: replaced under this start 8 times", path)
}

// lockHolder is the pid the holder of the lock open as fd wrote there, or
// "unknown" before it wrote it.
func lockHolder(fd int) string {
	b := make([]byte, 16)
	n, _ := unix.Pread(fd, b, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:max(n, 0)])))
	if err != nil || pid <= 0 {
		return "unknown"
	}
	return strconv.Itoa(pid)
}

// Release unlinks the lock file and lets go of the lock; on nil it does
// nothing. The name is removed while the lock is held, so the next start
// creates and locks a new file (see Lock).
func (l *StartLock) Release() error {
	if l == nil {
		return nil
	}
	var err error
	if uerr := unix.Unlinkat(l.dfd, l.name, 0); uerr != nil && !errors.Is(uerr, unix.ENOENT) {
		err = fmt.Errorf("start lock %s: %w", l.name, uerr)
	}
	unix.Close(l.fd)
	unix.Close(l.dfd)
	return err
}
