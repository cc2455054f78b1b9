package rpc

/*
#cgo noescape kv_recv
#cgo nocallback kv_recv
#cgo noescape kv_msg_copy
#cgo nocallback kv_msg_copy
#include <zmq.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define KV_RECV_MAX 16

// kv_recv_t is what one kv_recv call read.
typedef struct {
	int n;                      // frames read by this call
	size_t sizes[KV_RECV_MAX];  // their sizes
	size_t used;                // bytes copied into buf
	zmq_msg_t *held;            // set: frame n-1 is here (malloc'd), not in buf
	int more;                   // more frames of the message follow frame n-1
	int err;                    // errno when the first receive failed (n == 0)
} kv_recv_t;

// kv_recv reads frames of one message: frames that fit in what is left of
// buf are copied there back to back and closed; the first that does not is
// moved into a malloc'd message and returned in held (the caller reads on
// after it), so a large frame is never copied here. flags apply to the first
// receive only: the rest of a multipart message is always there at once.
// It stops at the end of the message or after KV_RECV_MAX frames.
static void kv_recv(void *sock, int flags, char *buf, size_t cap, kv_recv_t *r) {
	r->n = 0;
	r->used = 0;
	r->held = NULL;
	r->more = 0;
	r->err = 0;
	for (;;) {
		zmq_msg_t m;
		zmq_msg_init(&m);
		int rc;
		do {
			// EINTR: interrupted before a frame was taken; a multipart
			// message must not be cut there.
			rc = zmq_msg_recv(&m, sock, flags);
		} while (rc < 0 && errno == EINTR);
		if (rc < 0) {
			r->err = errno;
			zmq_msg_close(&m);
			return;
		}
		flags = 0;
		size_t sz = zmq_msg_size(&m);
		r->more = zmq_msg_more(&m);
		r->sizes[r->n] = sz;
		r->n++;
		if (sz <= cap - r->used) {
			if (sz) {
				memcpy(buf + r->used, zmq_msg_data(&m), sz);
			}
			r->used += sz;
			zmq_msg_close(&m);
		} else {
			zmq_msg_t *h = malloc(sizeof *h);
			if (h == NULL) {
				// No memory to keep it: count its size, drop its bytes;
				// the caller sees a nil frame and refuses the message.
				zmq_msg_close(&m);
				r->sizes[r->n - 1] = (size_t)-1;
				if (!r->more || r->n == KV_RECV_MAX) {
					return;
				}
				continue;
			}
			zmq_msg_init(h);
			zmq_msg_move(h, &m);
			zmq_msg_close(&m);
			r->held = h;
			return;
		}
		if (!r->more || r->n == KV_RECV_MAX) {
			return;
		}
	}
}

static void *kv_msg_data(zmq_msg_t *m) { return zmq_msg_data(m); }

static void kv_msg_copy(zmq_msg_t *m, void *dst) { memcpy(dst, zmq_msg_data(m), zmq_msg_size(m)); }

static void kv_msg_free(zmq_msg_t *m) {
	zmq_msg_close(m);
	free(m);
}
*/
import "C"

import (
	"bytes"
	"sync/atomic"
	"unsafe"

	zmq "github.com/pebbe/zmq4"
)

// Receiving. pebbe's RecvBytes copies every frame out of libzmq into a
// fresh Go slice (and asks ZMQ_RCVMORE with one more call per frame). The
// socket goroutine reads through kv_recv on the same handle instead: small
// frames are copied into one scratch buffer in one C call per message (one
// Go allocation for all of them), and a frame of borrowFrom bytes or more
// is not copied at all: it stays in libzmq's buffer, borrowed by the request
// until its handler is done (the documented life of a []byte arg), and is
// charged meanwhile to the in-flight bytes.
const (
	recvScratch = 256 << 10
	borrowFrom  = 1 << 20
)

// msgFrame is one received frame: Go memory, or a libzmq buffer (msg set).
type msgFrame struct {
	b   []byte
	msg *C.zmq_msg_t
}

// borrowed is the libzmq buffers a request holds; nil when none.
type borrowed struct {
	msgs  []*C.zmq_msg_t
	bytes int64
	held  *atomic.Int64 // the server's in-flight count they are charged to
}

// release gives the buffers back to libzmq, which frees them (those over
// glibc's mmap threshold go back to the OS at once), and uncharges them.
// Safe on nil and more than once.
func (b *borrowed) release() {
	if b == nil || b.msgs == nil {
		return
	}
	for _, m := range b.msgs {
		C.kv_msg_free(m)
	}
	b.held.Add(-b.bytes)
	b.msgs, b.bytes = nil, 0
}

// receiver reads whole messages from the ROUTER handle.
type receiver struct {
	raw     unsafe.Pointer
	scratch []byte
	r       C.kv_recv_t
	parts   []msgFrame // reused between calls
	// inScratch: the last message's small frames are slices of scratch
	// (it came in one call), overwritten by the next recv.
	inScratch bool
}

// detach moves the frames that point into scratch to one Go slice of their
// own (the rest, borrowed or copied, stay as they are), so that they outlive
// the next recv.
func (rc *receiver) detach(frames [][]byte) {
	if !rc.inScratch {
		return
	}
	in := func(f []byte) bool {
		return len(f) > 0 && uintptr(unsafe.Pointer(&f[0]))-uintptr(unsafe.Pointer(&rc.scratch[0])) < uintptr(len(rc.scratch))
	}
	n := 0
	for _, f := range frames {
		if in(f) {
			n += len(f)
		}
	}
	own := make([]byte, 0, n)
	for i, f := range frames {
		if in(f) {
			at := len(own)
			own = append(own, f...)
			frames[i] = own[at:len(own):len(own)]
		}
	}
}

func newReceiver(raw unsafe.Pointer) *receiver {
	return &receiver{raw: raw, scratch: make([]byte, recvScratch)}
}

// recv reads one message without blocking (ok false: nothing to read). It
// returns at most maxFrames frames (tooMany: there were more, read and
// discarded) and their total size; over limit, or when a frame could not be
// kept, frames is nil and nothing is held. Small frames share one Go slice,
// or, when the message came in one call (the common case), stay in the
// receive buffer until the next recv (inScratch; detach copies them out);
// large ones are borrowed (charged to held).
func (rc *receiver) recv(limit int64, held *atomic.Int64) (frames [][]byte, b *borrowed, total int64, tooMany, lost, ok bool) {
	rc.inScratch = false
	parts := rc.parts[:0]
	defer func() {
		clear(parts)
		rc.parts = parts[:0]
	}()
	var small []byte // the small frames of this message, back to back
	flags := C.int(zmq.DONTWAIT)
	for first := true; ; first = false {
		buf := rc.scratch
		C.kv_recv(rc.raw, flags, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &rc.r)
		flags = 0
		n := int(rc.r.n)
		if n == 0 {
			if first {
				return nil, nil, 0, false, false, false
			}
			break // the rest of a message is always there: a closed socket
		}
		used := int(rc.r.used)
		if first && rc.r.more == 0 {
			// The whole message in one call: its small frames stay in the
			// scratch buffer, valid until the next recv (the socket
			// goroutine detaches them when it hands the request off).
			small = buf[:used:used]
			rc.inScratch = true
		} else {
			// One Go allocation per call for the small frames it copied.
			small = bytes.Clone(buf[:used])
		}
		off := 0
		for i := range n {
			if rc.r.sizes[i] == ^C.size_t(0) {
				lost = true
				parts = append(parts, msgFrame{})
				continue
			}
			sz := int64(rc.r.sizes[i])
			total += sz
			if i == n-1 && rc.r.held != nil {
				m := rc.r.held
				data := unsafe.Slice((*byte)(C.kv_msg_data(m)), sz)
				if sz < borrowFrom {
					// Not worth borrowing: copy and give it back now.
					parts = append(parts, msgFrame{b: copyMsg(m)})
					C.kv_msg_free(m)
				} else {
					parts = append(parts, msgFrame{b: data, msg: m})
				}
				continue
			}
			parts = append(parts, msgFrame{b: small[off : off+int(sz) : off+int(sz)]})
			off += int(sz)
		}
		if rc.r.more == 0 {
			break
		}
	}
	over := total > limit || lost
	if len(parts) > maxFrames {
		tooMany = true
	}
	for i := range parts {
		if parts[i].msg == nil {
			continue
		}
		if over || i >= maxFrames || i < 3 {
			// Refused, beyond the frames kept, or a header frame (identity,
			// uid, type are kept beyond the handler): not borrowed.
			if i < 3 {
				parts[i].b = copyMsg(parts[i].msg)
			} else {
				parts[i].b = nil
			}
			C.kv_msg_free(parts[i].msg)
			parts[i].msg = nil
			continue
		}
		if b == nil {
			b = &borrowed{held: held}
		}
		b.msgs = append(b.msgs, parts[i].msg)
		b.bytes += int64(len(parts[i].b))
	}
	if over {
		return [][]byte{parts[0].b}, nil, total, tooMany, lost, true
	}
	if b != nil {
		held.Add(b.bytes)
	}
	frames = make([][]byte, 0, min(len(parts), maxFrames))
	for i := range min(len(parts), maxFrames) {
		frames = append(frames, parts[i].b)
	}
	return frames, b, total, tooMany, lost, true
}

// settle copies the borrowed frames that the request's arguments would not
// hand to its handler as []byte (any type but bytes at that position of the
// matching payload shape) into Go memory and gives their buffers back, so
// that only bytes args (valid while the handler runs) point into libzmq.
func settle(frames [][]byte, b *borrowed, bytesAt func(i int) bool) {
	if b == nil {
		return
	}
	keep := b.msgs[:0]
	for _, m := range b.msgs {
		data := unsafe.Pointer(C.kv_msg_data(m))
		idx := -1
		for i, f := range frames {
			if len(f) > 0 && unsafe.Pointer(&f[0]) == data {
				idx = i
				break
			}
		}
		if idx >= 3 && bytesAt(idx-3) {
			keep = append(keep, m)
			continue
		}
		if idx >= 0 {
			frames[idx] = copyMsg(m)
		}
		n := int64(C.zmq_msg_size(m))
		C.kv_msg_free(m)
		b.bytes -= n
		b.held.Add(-n)
	}
	b.msgs = keep
}

// copyMsg copies a libzmq frame into Go memory. The copy is C's: under the
// race detector a Go read of C memory would give it shadow pages as large.
func copyMsg(m *C.zmq_msg_t) []byte {
	n := int(C.zmq_msg_size(m))
	b := make([]byte, n)
	if n > 0 {
		C.kv_msg_copy(m, unsafe.Pointer(&b[0]))
	}
	return b
}
