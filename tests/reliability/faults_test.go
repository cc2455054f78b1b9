package reliability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/core/testkit/poll"
	"kvdock/tests/harness"
)

// killedWorker runs a py/faults.py scenario that ends with the worker
// killing itself with SIGKILL; it returns the JSON the worker printed
// before dying and fails unless the worker died by SIGKILL.
func killedWorker(t *testing.T, srv *harness.Server, scenario string, params map[string]any) map[string]any {
	t.Helper()
	p, _ := json.Marshal(params)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, harness.Python, "py/faults.py", srv.Endpoint, scenario, string(p))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("%s: want death by SIGKILL, got %v\nstdout %s\nstderr %s", scenario, err, out, stderr.String())
	}
	var res map[string]any
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%s output %q: %v", scenario, out, err)
	}
	return res
}

// TestWorkerKilledBetweenPrepareAndCommitStore: the dead worker's write
// reservation is reclaimed by the write TTL, its garbage is never
// published, and the pool returns to its baseline.
func TestWorkerKilledBetweenPrepareAndCommitStore(t *testing.T) {
	srv := harness.Start(t, "--chunk-size", "16", "--l1-write-ttl-seconds", "4")
	base := srv.Status(t).Pool
	res := killedWorker(t, srv, "die_mid_store", map[string]any{"instance_id": 501, "seed": 77, "chunks": 3})
	if res["slots"] != float64(3) {
		t.Fatalf("worker got %v slots, want 3", res["slots"])
	}
	mid := srv.Status(t).Pool
	if mid.WriteLocked != 3 || mid.UsedBytes <= base.UsedBytes {
		t.Fatalf("reservation not visible while the worker is dead: %+v", mid)
	}
	c := srv.Dial(t, srv.Protocol)
	toks := pyTokens(77, 3*16) // the dead worker's tokens
	if n, err := harness.Lookup(context.Background(), c, "faults-model", toks, "l-mid"); err != nil || n != 0 {
		t.Fatalf("half-written chunks visible to LOOKUP: %d %v", n, err)
	}
	poll.Until(t, 10*time.Second, "write reservation reclaimed by the TTL", func() bool {
		p := srv.Status(t).Pool
		return p.WriteLocked == 0 && p.UsedBytes == base.UsedBytes && p.Objects == base.Objects
	})

	// The transfer module aborts the reservation at half the TTL; the pool's
	// own write TTL is the backstop. Either way it is counted.
	if st := srv.Status(t); st.Transfer.Expired < 1 && st.Pool.ExpiredWriteLocks < 3 {
		t.Fatalf("reclaim not counted: transfer expired %d, pool expired write locks %d", st.Transfer.Expired, st.Pool.ExpiredWriteLocks)
	}
	if n, err := harness.Lookup(context.Background(), c, "faults-model", toks, "l-after"); err != nil || n != 0 {
		t.Fatalf("garbage of a dead worker published: %d hits, %v", n, err)
	}
	// A second dead writer, removed by the operator: its garbage is never
	// published, and its slots come back at the write TTL (a dropped
	// worker may still be copying), not before.
	killedWorker(t, srv, "die_mid_store", map[string]any{"instance_id": 503, "seed": 78, "chunks": 2})
	if p := srv.Status(t).Pool; p.WriteLocked != 2 {
		t.Fatalf("write locks of the second dead worker: %d, want 2", p.WriteLocked)
	}
	postUnregister(t, srv, 503)
	poll.Until(t, 10*time.Second, "the removed writer's reservation reclaimed by the TTL", func() bool {
		p := srv.Status(t).Pool
		return p.WriteLocked == 0 && p.UsedBytes == base.UsedBytes && p.Objects == base.Objects
	})

	if n, err := harness.Lookup(context.Background(), c, "faults-model", pyTokens(78, 2*16), "l-unreg"); err != nil || n != 0 {
		t.Fatalf("garbage of an unregistered dead worker published: %d hits, %v", n, err)
	}
	// The same chunks stored properly afterwards read back byte-correct.
	w := harness.NewWorker(t, c, 502, "faults-model", false)
	data := [][]byte{harness.ChunkData(77, 0, w.ChunkBytes), harness.ChunkData(77, 1, w.ChunkBytes), harness.ChunkData(77, 2, w.ChunkBytes)}
	if r, err := w.Store(context.Background(), toks, data, "s"); err != nil || r != "true" {
		t.Fatalf("store after reclaim: %q %v", r, err)
	}
	got, err := w.Retrieve(context.Background(), toks, 3, "r")
	if err != nil || len(got) != 3 {
		t.Fatalf("retrieve after reclaim: %d chunks, %v", len(got), err)
	}
	for i := range got {
		if harness.Sum(got[i]) != harness.Sum(data[i]) {
			t.Fatalf("chunk %d differs after a dead worker's reservation was reclaimed", i)
		}
	}
}

// TestWorkerKilledBetweenPrepareAndCommitRetrieve: the read locks of a dead
// reader are reset by the read TTL, whether it is left alone (SHM) or
// removed by the operator (pickle); the chunks stay correct and evictable.
func TestWorkerKilledBetweenPrepareAndCommitRetrieve(t *testing.T) {
	srv := harness.Start(t, "--chunk-size", "16", "--l1-read-ttl-seconds", "4")
	c := srv.Dial(t, srv.Protocol)
	w := harness.NewWorker(t, c, 600, "faults-model", false)
	toks := pyTokens(91, 2*16)
	data := [][]byte{harness.ChunkData(91, 0, w.ChunkBytes), harness.ChunkData(91, 1, w.ChunkBytes)}
	if r, err := w.Store(context.Background(), toks, data, "s"); err != nil || r != "true" {
		t.Fatalf("store: %q %v", r, err)
	}
	base := srv.Status(t).Pool
	for _, tc := range []struct {
		name   string
		id     int
		pickle bool
	}{{"shm_ttl", 601, false}, {"pickle_unregister", 602, true}} {
		t.Run(tc.name, func(t *testing.T) {
			res := killedWorker(t, srv, "die_mid_retrieve", map[string]any{"instance_id": tc.id, "seed": 91, "chunks": 2, "force_pickle": tc.pickle})
			if res["success"] != true {
				t.Fatalf("dying reader missed: %v", res)
			}
			if p := srv.Status(t).Pool; p.ReadLocked != 2 {
				t.Fatalf("read locks while the reader is dead: %d, want 2", p.ReadLocked)
			}
			if tc.pickle {
				postUnregister(t, srv, int64(tc.id))
			}
			poll.Until(t, 10*time.Second, "read locks reclaimed", func() bool {
				p := srv.Status(t).Pool
				return p.ReadLocked == 0 && p.UsedBytes == base.UsedBytes && p.Objects == base.Objects
			})

			got, err := w.Retrieve(context.Background(), toks, 2, "r-"+tc.name)
			if err != nil || len(got) != 2 || harness.Sum(got[0]) != harness.Sum(data[0]) || harness.Sum(got[1]) != harness.Sum(data[1]) {
				t.Fatalf("chunks after a dead reader: %d %v", len(got), err)
			}
		})
	}
}

// pyTokens is lmcache_worker.tokens_for.
func pyTokens(seed, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32((seed*7919 + i*31) % 50000)
	}
	return out
}

// TestServerKilledStaleSegmentReclaimed: kvdock killed with SIGKILL leaves
// its segment; the next start with the same name removes it and serves.
func TestServerKilledStaleSegmentReclaimed(t *testing.T) {
	name := harness.UniqueName("relstale")
	seg := "lmcache_l1_pool_" + name
	srv := harness.Start(t, "--shm-name", name)
	srv.Kill()
	if !harness.SegmentExists(seg) {
		t.Fatalf("SIGKILL should leave %s behind (else this test proves nothing)", seg)
	}
	srv2 := harness.Start(t, "--shm-name", name)
	st := srv2.Status(t)
	if st.ShmName != seg || !harness.SegmentExists(seg) {
		t.Fatalf("restart: advertised %q", st.ShmName)
	}
	if !strings.Contains(srv2.Output(), "stale") || !strings.Contains(srv2.Output(), seg) {
		t.Fatalf("log does not mention the removed stale segment:\n%s", srv2.Output())
	}
	c := srv2.Dial(t, srv2.Protocol)
	w := harness.NewWorker(t, c, 1, "m", false)
	toks := harness.Tokens(3, 1, w.Chunk)
	if r, err := w.Store(context.Background(), toks, [][]byte{harness.ChunkData(3, 0, w.ChunkBytes)}, "s"); err != nil || r != "true" {
		t.Fatalf("store on the reclaimed name: %q %v", r, err)
	}
}

// TestTwoServersSideBySideAndBusyName: two names coexist; asking for a
// live server's name fails with a message naming the segment.
func TestTwoServersSideBySideAndBusyName(t *testing.T) {
	a := harness.Start(t)
	b := harness.Start(t)
	if a.Segment == b.Segment || !harness.SegmentExists(a.Segment) || !harness.SegmentExists(b.Segment) {
		t.Fatalf("side by side: %s %s", a.Segment, b.Segment)
	}
	for _, s := range []*harness.Server{a, b} {
		if st := s.Status(t); st.ShmName != s.Segment || st.State != "serving" {
			t.Fatalf("%s: %+v", s.Segment, st.ShmName)
		}
	}
	bare := strings.TrimPrefix(a.Segment, "lmcache_l1_pool_")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, harness.Binary(t), "--headless", "--port", fmt.Sprint(harness.FreePort(t)),
		"--http-port", fmt.Sprint(harness.FreePort(t)), "--l1-size-gb", "0.0625", "--no-l1-prefault", "--shm-name", bare)
	cmd.Env = append(os.Environ(), "KVDOCK_CONFIG=")
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("second server on a live name: err %v ctx %v\n%s", err, ctx.Err(), out)
	}
	if !strings.Contains(string(out), a.Segment) {
		t.Fatalf("error does not name the segment %s:\n%s", a.Segment, out)
	}
	// The first server is untouched.
	if !harness.SegmentExists(a.Segment) || a.Status(t).State != "serving" {
		t.Fatal("the live server lost its segment")
	}
}

// TestShmTooSmallFallsBack: a pool larger than /dev/shm's free space starts
// with SHM off and says why, with both numbers; no hang.
func TestShmTooSmallFallsBack(t *testing.T) {
	var fs unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &fs); err != nil {
		t.Fatal(err)
	}
	free := int64(fs.Bavail) * int64(fs.Bsize)
	gb := float64(free+(1<<30)) / float64(1<<30)
	start := time.Now()
	// The harness names the segment (--shm-name NAME): the named path must
	// still fall back when the segment cannot fit. With SHM off the pool is
	// lazy anonymous memory and --no-l1-prefault touches none of it; such
	// a pool is usually past MemAvailable too, which start-up refuses
	// without --l1-allow-overcommit.
	srv := harness.Start(t, "--l1-size-gb", fmt.Sprintf("%.3f", gb), "--l1-allow-overcommit")
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("startup took %v", d)
	}
	st := srv.Status(t)
	if st.ShmName != "" || st.PoolSize != 0 {
		t.Fatalf("advertised %q %d for a pool larger than /dev/shm", st.ShmName, st.PoolSize)
	}
	if harness.SegmentExists(srv.Segment) {
		t.Fatalf("segment %s created although it does not fit", srv.Segment)
	}
	t.Logf("shm_reason: %s", st.ShmReason)
	if !strings.Contains(st.ShmReason, "/dev/shm") || !containsNumber(st.ShmReason) {
		t.Fatalf("shm_reason does not say why with numbers: %q", st.ShmReason)
	}
	c := srv.Dial(t, srv.Protocol)
	w := harness.NewWorker(t, c, 9, "m", false)
	if w.Mode() != "pickle" || w.SegName != "" || w.PoolSize != 0 {
		t.Fatalf("register reply {%q, %d}, want {\"\", 0}", w.SegName, w.PoolSize)
	}
	toks := harness.Tokens(5, 2, w.Chunk)
	data := [][]byte{harness.ChunkData(5, 0, w.ChunkBytes), harness.ChunkData(5, 1, w.ChunkBytes)}
	if r, err := w.Store(context.Background(), toks, data, "s"); err != nil || r != "true" {
		t.Fatalf("pickle store: %q %v", r, err)
	}
	got, err := w.Retrieve(context.Background(), toks, 2, "r")
	if err != nil || len(got) != 2 || harness.Sum(got[1]) != harness.Sum(data[1]) {
		t.Fatalf("pickle retrieve: %d %v", len(got), err)
	}
}

func containsNumber(s string) bool {
	n := 0
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r < '0' || r > '9' }) {
		if f != "" {
			n++
		}
	}
	return n >= 2
}
