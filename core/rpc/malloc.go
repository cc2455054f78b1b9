package rpc

/*
#include <malloc.h>

// kv_arena_max is M_ARENA_MAX as set when the process was loaded (0 if
// glibc refused it): see TuneMalloc. It runs as a constructor because
// only threads that malloc for the first time after it share the main
// arena, and the Go runtime starts threads (which malloc) before main.
static int kv_arena_max;

__attribute__((constructor)) static void kv_one_arena(void) {
	if (mallopt(M_ARENA_MAX, 1) == 1) {
		kv_arena_max = 1;
	}
}

static int kv_arena_setting(void) { return kv_arena_max; }
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
	// ArenaMax is the glibc M_ARENA_MAX in effect (0 if unchanged).
	ArenaMax int
	// Note says why a requested value was lowered or refused.
	Note string
}

func (t MallocTuning) String() string {
	s := fmt.Sprintf("mmap_threshold=%d trim_threshold=%d arena_max=%d", t.MmapThreshold, t.TrimThreshold, t.ArenaMax)
	if t.Note != "" {
		s += " (" + t.Note + ")"
	}
	return s
}

// note adds why a requested value was lowered or refused.
func (t *MallocTuning) note(s string) {
	if t.Note != "" {
		t.Note += "; "
	}
	t.Note += s
}

// tuneTarget is the threshold TuneMalloc asks for: large ZMQ messages are
// allocated by libzmq with malloc, and at glibc's defaults every message over
// 128 KiB (or the dynamic threshold) is a fresh mmap + page faults + munmap.
const tuneTarget = 1 << 30

// TuneMalloc raises glibc's mmap and trim thresholds so libzmq's large
// message buffers are recycled from the heap instead of being mmapped and
// unmapped per message (halving the mmap threshold down to what glibc
// accepts, and saying so), and reports the single arena set at load. Call
// it once at start-up, before traffic (main does). One arena because
// malloc_trim trims only the main arena: freed memory in libzmq's I/O
// thread's own arena would otherwise stay resident for good.
func TuneMalloc() MallocTuning {
	var t MallocTuning
	if t.ArenaMax = int(C.kv_arena_setting()); t.ArenaMax == 0 {
		t.note("M_ARENA_MAX refused")
	}
	if C.mallopt(C.M_TRIM_THRESHOLD, C.int(tuneTarget)) == 1 {
		t.TrimThreshold = tuneTarget
	} else {
		t.note("M_TRIM_THRESHOLD refused")
	}
	for v := int64(tuneTarget); v >= 128<<10; v /= 2 {
		if C.mallopt(C.M_MMAP_THRESHOLD, C.int(v)) == 1 {
			t.MmapThreshold = v
			if v != tuneTarget {
				t.note(fmt.Sprintf("glibc caps M_MMAP_THRESHOLD, %d used instead of %d", v, int64(tuneTarget)))
			}
			break
		}
	}
	return t
}

// Scavenging: neither glibc (trim threshold raised) nor Go's background
// scavenger returns freed pages soon, so after a burst of large messages
// the process would keep hundreds of MiB resident. At most once per tick,
// while the server is idle (nothing queued, charged or running), freed
// memory goes back to the OS when scavengeAfter bytes of large messages
// moved (or lie freed in the Go heap), or, once per lull (a whole tick
// without a message), when at least scavengeQuiet did.
const (
	scavengeAfter = 64 << 20
	scavengeQuiet = 4 << 20
	scavengeTick  = time.Second
)

// churn counts the bytes of large messages moved since the last scavenge,
// and every message (requests read, replies queued), and keeps when the
// last one came (Server.LastMessage).
type churn struct{ n, msgs, last atomic.Int64 }

// add counts a message of n bytes; small ones do not fill the heaps.
func (c *churn) add(n int64) {
	c.msgs.Add(1)
	c.last.Store(time.Now().UnixNano())
	if n >= 64<<10 {
		c.n.Add(n)
	}
}

// scavenge runs until ctx is done: each tick, when enough churn happened
// and idle reports true, freed Go and C memory goes back to the OS.
func (c *churn) scavenge(ctx context.Context, idle func() bool, log *slog.Logger) {
	t := time.NewTicker(scavengeTick)
	defer t.Stop()
	var due scavengeDue
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		moved, free := c.n.Load(), goHeapFree()
		run, lull := due.tick(c.msgs.Load(), moved, free)
		if !run || !idle() {
			continue
		}
		c.n.Add(-moved)
		due.freed()
		t0 := time.Now()
		debug.FreeOSMemory()
		C.malloc_trim(0)
		dropCachedReplyBuffers()
		log.Debug("freed memory returned to the OS", "large_message_bytes", moved, "go_heap_free", free,
			"lull", lull, "took", time.Since(t0))
	}
}

// scavengeDue decides, tick by tick, whether freed memory should go back
// to the OS (see "Scavenging" above); the caller checks idleness.
type scavengeDue struct {
	seen    int64 // messages counted at the last tick
	freedAt int64 // messages counted at the last scavenge
}

// tick takes the message count and the bytes moved and freed now: run
// says a scavenge is due, lull that it is due to a lull, not a burst.
func (d *scavengeDue) tick(msgs, moved, free int64) (run, lull bool) {
	quietTick := msgs == d.seen && msgs != d.freedAt
	d.seen = msgs
	if moved >= scavengeAfter || free >= scavengeAfter {
		return true, false
	}
	if quietTick && (moved >= scavengeQuiet || free >= scavengeQuiet) {
		return true, true
	}
	return false, false
}

// freed records a scavenge: the next lull-time one needs new messages.
func (d *scavengeDue) freed() { d.freedAt = d.seen }

// goHeapFree is the Go heap's free memory not yet returned to the OS.
func goHeapFree() int64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(sample[0].Value.Uint64())
}
