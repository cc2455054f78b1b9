package rpc

/*
#cgo !windows pkg-config: libzmq
#include <zmq.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// A message body with the counter it is charged to: libzmq calls kv_free
// once it has written the message to the connection (or dropped it), which
// is the moment its bytes stop being held for that peer.
typedef struct { int64_t size; int64_t *held; } kv_hdr;

static void kv_free(void *data, void *hint) {
	kv_hdr *h = (kv_hdr *)hint;
	(void)data;
	__atomic_sub_fetch(h->held, h->size, __ATOMIC_RELEASE);
	free(h);
}

// kv_send sends a copy of p[0:n] on sock, charging n bytes to *held until
// libzmq releases the message.
static int kv_send(void *sock, const void *p, size_t n, int flags, int64_t *held) {
	kv_hdr *h = malloc(sizeof(kv_hdr) + (n ? n : 1));
	if (h == NULL) {
		errno = ENOMEM;
		return -1;
	}
	char *data = (char *)h + sizeof(kv_hdr);
	if (n) {
		memcpy(data, p, n);
	}
	h->size = (int64_t)n;
	h->held = held;
	__atomic_add_fetch(held, (int64_t)n, __ATOMIC_RELAXED);
	zmq_msg_t m;
	if (zmq_msg_init_data(&m, data, n, kv_free, h) != 0) {
		int e = errno;
		__atomic_sub_fetch(held, (int64_t)n, __ATOMIC_RELAXED);
		free(h);
		errno = e;
		return -1;
	}
	int rc = zmq_msg_send(&m, sock, flags);
	if (rc < 0) {
		int e = errno;
		zmq_msg_close(&m);
		errno = e;
	}
	return rc;
}

static int kv_socket_type(void *sock) {
	int t = -1;
	size_t n = sizeof t;
	if (zmq_getsockopt(sock, ZMQ_TYPE, &t, &n) != 0) {
		return -1;
	}
	return t;
}

static int64_t *kv_counter(void) { return calloc(1, sizeof(int64_t)); }
static void kv_counter_free(int64_t *c) { free(c); }
*/
import "C"

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

	zmq "github.com/pebbe/zmq4"
)

// rawSocket is libzmq's handle behind a pebbe socket. pebbe (v1.4.0, pinned
// in go.mod) has no send whose buffer release can be observed, so replies are
// sent through kv_send on the same handle: the first field of zmq4.Socket is
// that handle, and rawSocket checks it is the ROUTER it should be.
func rawSocket(s *zmq.Socket) (unsafe.Pointer, error) {
	p := *(*unsafe.Pointer)(unsafe.Pointer(s))
	if p == nil || C.kv_socket_type(p) != C.ZMQ_ROUTER {
		return nil, errors.New("rpc: cannot reach the libzmq handle of the ROUTER socket")
	}
	return p, nil
}

// heldCounter is a C-allocated count of the bytes libzmq holds for one peer
// (written by libzmq's I/O thread, read here atomically).
type heldCounter struct{ p *C.int64_t }

func newHeldCounter() (heldCounter, error) {
	p := C.kv_counter()
	if p == nil {
		return heldCounter{}, errors.New("rpc: out of memory for a reply counter")
	}
	return heldCounter{p}, nil
}

func (h heldCounter) load() int64 { return atomic.LoadInt64((*int64)(unsafe.Pointer(h.p))) }

// free releases the counter; only once it reads 0 (no message charges it).
func (h heldCounter) free() { C.kv_counter_free(h.p) }

// sendCounted sends one frame, charging its bytes to h until libzmq has
// written or dropped it.
func sendCounted(sock unsafe.Pointer, b []byte, flags zmq.Flag, h heldCounter) error {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	rc, err := C.kv_send(sock, p, C.size_t(len(b)), C.int(flags), h.p)
	if rc < 0 {
		if errno, ok := err.(syscall.Errno); ok {
			return zmq.Errno(errno)
		}
		return fmt.Errorf("zmq_msg_send: %w", err)
	}
	return nil
}
