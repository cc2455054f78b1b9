package rpc

/*
#include <malloc.h>
*/
import "C"

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// MallocTuning reports what TuneMalloc set.
type MallocTuning struct {
	// MmapThreshold is the glibc M_MMAP_THRESHOLD in effect (0 if unchanged).
	MmapThreshold int64
	// TrimThreshold is the glibc M_TRIM_THRESHOLD in effect (0 if unchanged).
	TrimThreshold int64
	// Note says why a requested value was lowered or refused.
	Note string
}

func (t MallocTuning) String() string {
	s := fmt.Sprintf("mmap_threshold=%d trim_threshold=%d", t.MmapThreshold, t.TrimThreshold)
	if t.Note != "" {
		s += " (" + t.Note + ")"
	}
	return s
}

// tuneTarget is the threshold TuneMalloc asks for: large ZMQ messages are
// allocated by libzmq with malloc, and at glibc's defaults every message over
// 128 KiB (or the dynamic threshold) is a fresh mmap + page faults + munmap.
const tuneTarget = 1 << 30

// TuneMalloc raises glibc's mmap and trim thresholds so libzmq's large
// message buffers are recycled from the heap instead of being mmapped and
// unmapped per message. Call it once at start-up, before traffic (main does).
// glibc refuses an mmap threshold above HEAP_MAX_SIZE/2 (32 MiB on 64-bit);
// TuneMalloc then halves down to the largest value glibc accepts and says so.
func TuneMalloc() MallocTuning {
	var t MallocTuning
	if C.mallopt(C.M_TRIM_THRESHOLD, C.int(tuneTarget)) == 1 {
		t.TrimThreshold = tuneTarget
	} else {
		t.Note = "M_TRIM_THRESHOLD refused"
	}
	for v := int64(tuneTarget); v >= 128<<10; v /= 2 {
		if C.mallopt(C.M_MMAP_THRESHOLD, C.int(v)) == 1 {
			t.MmapThreshold = v
			if v != tuneTarget {
				if t.Note != "" {
					t.Note += "; "
				}
				t.Note += fmt.Sprintf("glibc caps M_MMAP_THRESHOLD, %d used instead of %d", v, int64(tuneTarget))
			}
			break
		}
	}
	return t
}

// Scavenging: large transient buffers (requests read from libzmq, replies
// copied out for it, Go copies of both) are freed, but neither glibc (its
// trim threshold is raised by TuneMalloc) nor Go's background scavenger
// gives the pages back soon: after a burst of large messages, or an attack,
// the process would keep hundreds of MiB resident. The server counts the
// bytes of large messages it moved since it last gave memory back, and
// once that passes scavengeAfter, or the Go heap holds that much freed but
// unreleased memory, and it is idle (nothing queued, charged or running)
// it returns freed memory to the OS: at most once per tick.
const (
	scavengeAfter = 64 << 20
	scavengeTick  = time.Second
)

// churn counts the bytes of large messages moved since the last scavenge.
type churn struct{ n atomic.Int64 }

// add counts a message of n bytes; small ones do not fill the heaps.
func (c *churn) add(n int64) {
	if n >= 64<<10 {
		c.n.Add(n)
	}
}

// scavenge runs until ctx is done: each tick, when enough churn happened
// and idle reports true, freed Go and C memory goes back to the OS.
func (c *churn) scavenge(ctx context.Context, idle func() bool, log *slog.Logger) {
	t := time.NewTicker(scavengeTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if (c.n.Load() < scavengeAfter && goHeapFree() < scavengeAfter) || !idle() {
			continue
		}
		moved, free := c.n.Swap(0), goHeapFree()
		t0 := time.Now()
		debug.FreeOSMemory()
		C.malloc_trim(0)
		dropCachedReplyBuffers()
		log.Debug("freed memory returned to the OS", "large_message_bytes", moved, "go_heap_free", free,
			"took", time.Since(t0))
	}
}

// goHeapFree is the Go heap's free memory not yet returned to the OS.
func goHeapFree() int64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(sample[0].Value.Uint64())
}
