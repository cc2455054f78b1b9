package rpc

import (
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The end of a handover, at the TCP level. libzmq closes a connection some
// hundreds of microseconds after its last reply leaves (the close passes
// through its reaper and the session's linger), and a worker that got its
// answer sends its next request within that time, down the connection that
// is closing: lost. So once libzmq has written the last answers to the
// kernel, the handover shuts the write side of every accepted connection
// itself: the FIN leaves right behind the answer, often in the same
// segment, and the worker's libzmq sees the end of the connection before
// its application can send again; its next request waits in the DEALER
// for the reconnection. The read side stays open until libzmq closes the
// socket, so a request that still comes is read (and counted), never
// answered with a reset.

// acceptedConns lists this process's TCP sockets whose local port is port
// and that have a peer: the ROUTER's accepted connections (our own
// DEALERs to that port have another local port; the listener has no peer).
func acceptedConns(port int) []int {
	fds, _ := ownFDs(func(fd int) bool { return isAccepted(fd, port) })
	return fds
}

// isAccepted reports whether fd is a connected TCP socket on local port.
func isAccepted(fd, port int) bool {
	if p, ok := localTCPPort(fd); !ok || p != port {
		return false
	}
	_, err := unix.Getpeername(fd)
	return err == nil
}

// cork holds back partial segments on fds (TCP_CORK) until the write side
// is shut: the last answer and the FIN then leave in one segment, so the
// worker's libzmq reads the end of the connection right after the answer.
func cork(fds []int) {
	for _, fd := range fds {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_CORK, 1)
	}
}

// bytesSent sums what the kernel has sent or holds to send on fds
// (TCP_INFO), and reports whether every fd answered.
func bytesSent(fds []int) (uint64, bool) {
	var n uint64
	for _, fd := range fds {
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return n, false
		}
		n += info.Bytes_sent + uint64(info.Notsent_bytes)
	}
	return n, true
}

// flushWait is how long the end waits for libzmq to write the last
// answers before it falls back to libzmq's own close.
const flushWait = 100 * time.Millisecond

// shutWhenWritten waits until the kernel has sent or queued want bytes more
// than base on fds, then shuts their write sides; false (nothing shut) when
// that did not happen within flushWait or the sockets changed.
func shutWhenWritten(fds []int, base, want uint64, port int) bool {
	deadline := time.Now().Add(flushWait)
	for {
		n, ok := bytesSent(fds)
		if !ok {
			return false
		}
		if n >= base+want {
			break
		}
		if time.Now().After(deadline) {
			return false
		}
		runtime.Gosched()
	}
	for _, fd := range fds {
		// The fd is libzmq's: check it is still the same kind of socket
		// (a closed fd's number may be reused) before shutting it.
		if isAccepted(fd, port) {
			_ = unix.Shutdown(fd, unix.SHUT_WR)
		}
	}
	return true
}

// boundPort is the TCP port the ROUTER is bound to (0 when unknown).
func (s *Server) boundPort() int {
	ep := s.Endpoint()
	i := len(ep) - 1
	for i >= 0 && ep[i] >= '0' && ep[i] <= '9' {
		i--
	}
	p, err := strconv.Atoi(ep[i+1:])
	if err != nil || i < 0 || ep[i] != ':' {
		return 0
	}
	return p
}
