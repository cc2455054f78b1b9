package rpc

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// The listening socket across a restart's exec. Between the old image's
// last answer and the new image's bind nothing listens on the port: a
// worker's DEALER that tries to reconnect is refused and tries again after
// libzmq's reconnect interval (100 to 200 ms, with its jitter), so the
// worker waits for its next retry after the new image is up. The old image
// keeps a duplicate of its listening socket (KeepListener), which the exec
// inherits; the kernel goes on accepting connections into its backlog
// while no process reads it, and the new image serves on that socket
// (Options.Listener, libzmq's ZMQ_USE_FD) instead of binding one. A
// SIGTERM and a new start have no such socket: nothing outlives the
// process that exits.

// KeepListener returns a duplicate of the socket the server listens on,
// without close-on-exec so that an exec keeps it, and the endpoint it was
// bound for (Options.ListenerFor of the server that takes it over). The
// caller owns the descriptor.
func (s *Server) KeepListener() (fd int, endpoint string, err error) {
	port := s.boundPort()
	if port == 0 {
		return -1, "", errors.New("rpc: the server is not bound")
	}
	ep, _, err := endpointFor(s.opts.Host, s.opts.Port)
	if err != nil {
		return -1, "", fmt.Errorf("rpc: %w", err)
	}
	fds, err := ownFDs(func(fd int) bool { return isListener(fd, port) })
	if err != nil {
		return -1, "", fmt.Errorf("rpc: list descriptors: %w", err)
	}
	if len(fds) == 0 {
		return -1, "", fmt.Errorf("rpc: no listening socket on port %d", port)
	}
	d, err := unix.Dup(fds[0]) // a duplicate has no close-on-exec
	if err != nil {
		return -1, "", fmt.Errorf("rpc: duplicate the listening socket: %w", err)
	}
	return d, ep, nil
}

// ownFDs lists this process's open descriptors that match.
func ownFDs(match func(fd int) bool) ([]int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && match(fd) {
			fds = append(fds, fd)
		}
	}
	return fds, nil
}

// isListener reports whether fd is a listening TCP socket on local port.
func isListener(fd, port int) bool {
	if p, ok := localTCPPort(fd); !ok || p != port {
		return false
	}
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	return err == nil && v == 1
}

// localTCPPort is the local port of fd when it is a TCP socket (IPv4 or
// IPv6).
func localTCPPort(fd int) (int, bool) {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return 0, false
	}
	if t, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || t != unix.SOCK_STREAM {
		return 0, false
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return 0, false
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return a.Port, true
	case *unix.SockaddrInet6:
		return a.Port, true
	}
	return 0, false
}

// takeListener returns a descriptor for libzmq to listen on (it owns it
// from then on), or -1 to bind: Options.Listener is used only when it was
// kept for this server's endpoint and is a listening TCP socket on its
// port. Options.Listener is closed either way.
func (s *Server) takeListener(ep string) (int, error) {
	f := s.opts.Listener
	if f == nil {
		return -1, nil
	}
	defer f.Close()
	fd := int(f.Fd())
	switch {
	case s.opts.ListenerFor != ep:
		return -1, fmt.Errorf("it was kept for %s, this server binds %s", s.opts.ListenerFor, ep)
	case s.opts.Port == 0 || !isListener(fd, s.opts.Port):
		return -1, fmt.Errorf("descriptor %d is not a listening TCP socket on port %d", fd, s.opts.Port)
	}
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("duplicate descriptor %d: %w", fd, err)
	}
	return d, nil
}
