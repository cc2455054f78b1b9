// Package zmqwait waits for a libzmq socket in Go's network poller instead
// of in a cgo call. A goroutine blocked in zmq_poll or a blocking receive
// keeps its P (one of GOMAXPROCS) until the runtime's sysmon takes it
// back, and each retake has sysmon wake every 20 µs for the next
// millisecond: a socket waited on that way costs an idle process a few ms
// of CPU a second, and a busy one the wake-ups its other goroutines need.
// A Waiter parks the goroutine on the socket's ZMQ_FD instead.
package zmqwait

import (
	"fmt"
	"os"
	"syscall"

	zmq "github.com/pebbe/zmq4"
	"golang.org/x/sys/unix"
)

// Waiter waits for a ZMQ socket's ZMQ_FD to be readable, through a
// duplicate of the descriptor (libzmq keeps the original; closing the
// duplicate leaves it open).
type Waiter struct {
	f  *os.File
	rc syscall.RawConn
}

// New returns a Waiter on s; name names the descriptor in errors.
func New(s *zmq.Socket, name string) (*Waiter, error) {
	fd, err := s.GetFd()
	if err != nil {
		return nil, fmt.Errorf("%s: the socket's fd: %w", name, err)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: duplicate the socket's fd: %w", name, err)
	}
	// libzmq's signalling descriptor is non-blocking already (the flag is
	// the open file's, shared with the duplicate); os.NewFile registers a
	// non-blocking descriptor with the poller.
	if err := unix.SetNonblock(dup, true); err != nil {
		_ = unix.Close(dup)
		return nil, fmt.Errorf("%s: the socket's fd: %w", name, err)
	}
	f := os.NewFile(uintptr(dup), name)
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%s: the socket's fd: %w", name, err)
	}
	return &Waiter{f: f, rc: rc}, nil
}

// Wait returns nil once ready reports true, calling it first and again
// each time the descriptor becomes readable; an error once w is closed.
// ZMQ_FD only says the socket's state may have changed: ready must look at
// the socket's events (ZMQ_EVENTS), and receive what waits, before it
// reports false, since a receive or send can take the signal.
func (w *Waiter) Wait(ready func() bool) error {
	return w.rc.Read(func(uintptr) bool { return ready() })
}

// Close ends a wait in progress and every later one.
func (w *Waiter) Close() error { return w.f.Close() }
