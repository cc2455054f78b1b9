package rpc

/*
#cgo !windows pkg-config: libzmq
#cgo noescape kv_copy_many
#cgo nocallback kv_copy_many
#cgo noescape kv_send_many
#cgo nocallback kv_send_many
#include <zmq.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <pthread.h>

// A reply frame copied out of Go memory, charged to its peer's counter and
// to the total from the copy until libzmq has written it to the connection
// (or dropped it): what waits in kvdock and what libzmq holds are one budget.
// zmq says whether libzmq owns the buffer: kv_free ignores the call made by
// closing a message that libzmq refused, which stays the caller's.
// A large buffer is mapped rather than malloc'd, so that the scavenger gives
// it back to the OS whole when it drops it, whatever glibc's heap holds
// around it (TuneMalloc raises the trim threshold, so free never shrinks
// the heap; before the single arena, freed replies stayed resident in
// thread arenas for good). Released mappings are kept for reuse, up to KV_CACHE_MAX bytes,
// so that a stream of large replies does not map and fault pages for each;
// kv_cache_drain unmaps them when the server is idle.
// extra, when set, is a counter the buffer's owner charged extra_n bytes to
// when it allocated it (Later.ReplyBuffer): uncharged on release like held.
typedef struct kv_buf { int64_t size; int64_t *held; int64_t *total; int64_t *extra; int64_t extra_n; int zmq; size_t cap; struct kv_buf *next; } kv_buf;

#define KV_MAP_FROM (1 << 20)
#define KV_CACHE_MAX ((size_t)64 << 20)

static pthread_mutex_t kv_cache_mu = PTHREAD_MUTEX_INITIALIZER;
static kv_buf *kv_cache;
static size_t kv_cached;

static kv_buf *kv_map(size_t need) {
	pthread_mutex_lock(&kv_cache_mu);
	for (kv_buf **pp = &kv_cache; *pp != NULL; pp = &(*pp)->next) {
		kv_buf *b = *pp;
		if (b->cap >= need && b->cap / 2 <= need) {
			*pp = b->next;
			kv_cached -= b->cap;
			pthread_mutex_unlock(&kv_cache_mu);
			return b;
		}
	}
	pthread_mutex_unlock(&kv_cache_mu);
	size_t cap = (need + KV_MAP_FROM - 1) & ~((size_t)KV_MAP_FROM - 1);
	void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		return NULL;
	}
	kv_buf *b = (kv_buf *)p;
	b->cap = cap;
	return b;
}

static void kv_release(kv_buf *b) {
	if (b->held != NULL) {
		__atomic_sub_fetch(b->held, b->size, __ATOMIC_RELEASE);
		__atomic_sub_fetch(b->total, b->size, __ATOMIC_RELEASE);
	}
	if (b->extra != NULL) {
		__atomic_sub_fetch(b->extra, b->extra_n, __ATOMIC_RELEASE);
		b->extra = NULL;
	}
	if (b->cap == 0) {
		free(b);
		return;
	}
	pthread_mutex_lock(&kv_cache_mu);
	if (kv_cached + b->cap <= KV_CACHE_MAX) {
		b->next = kv_cache;
		kv_cache = b;
		kv_cached += b->cap;
		b = NULL;
	}
	pthread_mutex_unlock(&kv_cache_mu);
	if (b != NULL) {
		munmap(b, b->cap);
	}
}

// kv_cache_drain unmaps the kept mappings.
static void kv_cache_drain(void) {
	pthread_mutex_lock(&kv_cache_mu);
	kv_buf *b = kv_cache;
	kv_cache = NULL;
	kv_cached = 0;
	pthread_mutex_unlock(&kv_cache_mu);
	while (b != NULL) {
		kv_buf *next = b->next;
		munmap(b, b->cap);
		b = next;
	}
}

static void kv_free(void *data, void *hint) {
	kv_buf *b = (kv_buf *)hint;
	(void)data;
	if (b->zmq) {
		kv_release(b);
	}
}

// kv_alloc makes an uncharged buffer of n bytes for a handler to write a
// reply into (kv_adopt charges it once it is the reply; kv_release frees it
// when it is not).
static kv_buf *kv_alloc(size_t n) {
	kv_buf *b;
	if (n >= KV_MAP_FROM) {
		b = kv_map(sizeof(kv_buf) + n);
	} else {
		b = malloc(sizeof(kv_buf) + (n ? n : 1));
		if (b != NULL) {
			b->cap = 0;
		}
	}
	if (b == NULL) {
		return NULL;
	}
	b->size = (int64_t)n;
	b->held = NULL;
	b->total = NULL;
	b->extra = NULL;
	b->zmq = 0;
	return b;
}

// kv_copy copies p[0:n] into a new buffer charged to *held and *total.
static kv_buf *kv_copy(const void *p, size_t n, int64_t *held, int64_t *total) {
	kv_buf *b = kv_alloc(n);
	if (b == NULL) {
		return NULL;
	}
	if (n) {
		memcpy((char *)b + sizeof(kv_buf), p, n);
	}
	b->held = held;
	b->total = total;
	__atomic_add_fetch(held, (int64_t)n, __ATOMIC_RELAXED);
	__atomic_add_fetch(total, (int64_t)n, __ATOMIC_RELAXED);
	return b;
}

// kv_charge charges b's n bytes to *extra until it is released.
static void kv_charge(kv_buf *b, int64_t *extra, int64_t n) {
	b->extra = extra;
	b->extra_n = n;
	__atomic_add_fetch(extra, n, __ATOMIC_RELAXED);
}

// kv_adopt makes b (n bytes of it) a reply frame charged to *held and *total.
static void kv_adopt(kv_buf *b, size_t n, int64_t *held, int64_t *total) {
	b->size = (int64_t)n;
	b->held = held;
	b->total = total;
	__atomic_add_fetch(held, (int64_t)n, __ATOMIC_RELAXED);
	__atomic_add_fetch(total, (int64_t)n, __ATOMIC_RELAXED);
}

static char *kv_data(kv_buf *b) { return (char *)b + sizeof(kv_buf); }

// kv_send hands b to libzmq without a copy. On success libzmq owns it and
// releases it through kv_free; on failure it is still the caller's.
static int kv_send(void *sock, kv_buf *b, int flags) {
	zmq_msg_t m;
	if (zmq_msg_init_data(&m, (char *)b + sizeof(kv_buf), (size_t)b->size, kv_free, b) != 0) {
		return -1;
	}
	b->zmq = 1;
	int rc;
	do {
		// EINTR: a signal (the Go runtime's, say) interrupted libzmq's
		// command processing before the frame was queued: send it again.
		rc = zmq_msg_send(&m, sock, flags);
	} while (rc < 0 && errno == EINTR);
	if (rc < 0) {
		int e = errno;
		b->zmq = 0; // no other thread has seen the message
		zmq_msg_close(&m);
		errno = e;
	}
	return rc;
}

// kv_send_many sends frames[from..n) as one message (SNDMORE on all but
// the last) without blocking; it returns how many it sent (libzmq owns those)
// and leaves errno set when it stopped early.
static int kv_send_many(void *sock, kv_buf **frames, int from, int n) {
	int i = from;
	for (; i < n; i++) {
		int flags = ZMQ_DONTWAIT | (i < n - 1 ? ZMQ_SNDMORE : 0);
		if (kv_send(sock, frames[i], flags) < 0) {
			break;
		}
	}
	return i - from;
}

// kv_copy_many copies n frames, packed back to back in src with their
// sizes in lens, into buffers out[0..n) charged to *held and *total; -1 when
// memory ran out (those made are freed).
static int kv_copy_many(const char *src, const size_t *lens, int n, int64_t *held, int64_t *total, kv_buf **out) {
	size_t off = 0;
	for (int i = 0; i < n; i++) {
		out[i] = kv_copy(src + off, lens[i], held, total);
		if (out[i] == NULL) {
			for (int j = 0; j < i; j++) {
				kv_release(out[j]);
			}
			return -1;
		}
		off += lens[i];
	}
	return 0;
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

// heldCounter is a C-allocated count of reply bytes copied out for a peer
// (or for all peers) and not yet released by libzmq: decremented by libzmq's
// I/O thread, read here atomically.
type heldCounter struct{ p *C.int64_t }

func newHeldCounter() (heldCounter, error) {
	p := C.kv_counter()
	if p == nil {
		return heldCounter{}, errors.New("rpc: out of memory for a reply counter")
	}
	return heldCounter{p}, nil
}

func (h heldCounter) load() int64 { return atomic.LoadInt64((*int64)(unsafe.Pointer(h.p))) }

// free releases the counter; only once it reads 0 (no buffer charges it).
func (h heldCounter) free() { C.kv_counter_free(h.p) }

// cbuf is one reply frame in C memory, charged to its peer and the total.
type cbuf struct{ p *C.kv_buf }

// copyOut copies b into C memory charged to peer and total; the Go copy
// can be collected at once.
func copyOut(b []byte, peer, total heldCounter) (cbuf, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	c := C.kv_copy(p, C.size_t(len(b)), peer.p, total.p)
	if c == nil {
		return cbuf{}, errors.New("rpc: out of memory for a reply")
	}
	return cbuf{c}, nil
}

// dropCachedReplyBuffers unmaps the reply buffers kept for reuse.
func dropCachedReplyBuffers() { C.kv_cache_drain() }

// release frees a buffer libzmq did not take, uncharging it.
func (c cbuf) release() { C.kv_release(c.p) }

// sendBuf hands one frame to libzmq without a copy. On success libzmq owns
// it; on error it is still the caller's (to retry or release).
func sendBuf(sock unsafe.Pointer, c cbuf, flags zmq.Flag) error {
	rc, err := C.kv_send(sock, c.p, C.int(flags))
	if rc < 0 {
		if errno, ok := err.(syscall.Errno); ok {
			return zmq.Errno(errno)
		}
		return fmt.Errorf("zmq_msg_send: %w", err)
	}
	return nil
}

// replyBuf is a C buffer a handler writes its reply into (Request.ReplyBuffer).
type replyBuf struct {
	c cbuf
	b []byte // the whole buffer, as the handler got it
}

func allocReply(n int) (replyBuf, error) {
	c := C.kv_alloc(C.size_t(n))
	if c == nil {
		return replyBuf{}, errors.New("rpc: out of memory for a reply buffer")
	}
	return replyBuf{c: cbuf{c}, b: unsafe.Slice((*byte)(unsafe.Pointer(C.kv_data(c))), n)}, nil
}

// charge charges rb's bytes to h until the buffer is released.
func (rb replyBuf) charge(h heldCounter) {
	C.kv_charge(rb.c.p, h.p, C.int64_t(len(rb.b)))
}

// holds reports whether b is a prefix of rb (a reply written into it).
func (rb replyBuf) holds(b []byte) bool {
	return len(b) > 0 && len(b) <= len(rb.b) && unsafe.Pointer(&b[0]) == unsafe.Pointer(&rb.b[0])
}

// adopt charges the first n bytes of rb as a reply frame to peer and total.
func (rb replyBuf) adopt(n int, peer, total heldCounter) cbuf {
	C.kv_adopt(rb.c.p, C.size_t(n), peer.p, total.p)
	return rb.c
}

// copyOutPacked copies frames (at most maxPacked, packBytes together) into
// C memory in one call, appending them to dst.
func copyOutPacked(dst []cbuf, frames [][]byte, peer, total heldCounter) ([]cbuf, error) {
	var scratch [packBytes]byte
	var lens [maxPacked]C.size_t
	var out [maxPacked]*C.kv_buf
	off := 0
	for i, f := range frames {
		off += copy(scratch[off:], f)
		lens[i] = C.size_t(len(f))
	}
	if C.kv_copy_many((*C.char)(unsafe.Pointer(&scratch[0])), &lens[0], C.int(len(frames)), peer.p, total.p, &out[0]) != 0 {
		return dst, errors.New("rpc: out of memory for a reply")
	}
	for _, c := range out[:len(frames)] {
		dst = append(dst, cbuf{c})
	}
	return dst, nil
}

// packBytes and maxPacked bound the frames of a reply copied out together.
const (
	packBytes = 4 << 10
	maxPacked = 4
)

// sendMany hands frames[from:] to libzmq as the rest of one message; it
// returns how many libzmq took and, when it stopped early, why.
func sendMany(sock unsafe.Pointer, frames []cbuf, from int) (int, error) {
	n, err := C.kv_send_many(sock, (**C.kv_buf)(unsafe.Pointer(&frames[0])), C.int(from), C.int(len(frames)))
	if int(n) < len(frames)-from {
		if errno, ok := err.(syscall.Errno); ok {
			return int(n), zmq.Errno(errno)
		}
		return int(n), fmt.Errorf("zmq_msg_send: %w", err)
	}
	return int(n), nil
}
