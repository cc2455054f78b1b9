package reliability

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kvdock/core/testkit/fakeresp"
	"kvdock/core/testkit/poll"
	"kvdock/tests/harness"
	"kvdock/tests/harness/attackkit"
)

// The resp tier against a hostile node (core/testkit/fakeresp), on the
// real binary: whatever the node answers, kvdock keeps serving, its memory
// and connections stay bounded, and /status says why the tier is down.

// hostileNode answers EXISTS and GET with what *exists and *get hold
// (raw RESP), everything else as a plain server would.
func hostileNode(t *testing.T, exists, get *atomic.Pointer[[]byte]) *fakeresp.Node {
	return fakeresp.Start(t, func(cmd []string) []byte {
		if r := fakeresp.Basic(cmd); r != nil {
			return r
		}
		switch cmd[0] {
		case "EXISTS":
			return *exists.Load()
		case "GET":
			return *get.Load()
		case "UNLINK", "DEL":
			return fakeresp.Int(1)
		case "SET":
			return fakeresp.OK
		}
		return fakeresp.Err("ERR unknown command " + cmd[0])
	})
}

func setReply(p *atomic.Pointer[[]byte], b []byte) { p.Store(&b) }

// TestHostileRESPReplies: a node that offers a 64 MiB value under each of
// a prompt's keys, then answers with a negative and a 1 TiB length (to
// EXISTS and to GET), then sanely again. kvdock reads none of the values
// (its RSS grows by less than 16 MiB where reading them takes 256 MiB),
// survives every reply, serves L1 throughout, and its tier comes back up.
func TestHostileRESPReplies(t *testing.T) {
	var exists, get atomic.Pointer[[]byte]
	setReply(&exists, fakeresp.Int(1))
	setReply(&get, fakeresp.Bulk(bytes.Repeat([]byte{0xA5}, 64<<20)))
	n := hostileNode(t, &exists, &get)
	srv := harness.Start(t, "--chunk-size", "16", "--l2-adapter",
		tierAdapter(t, map[string]any{"type": "resp", "host": "127.0.0.1", "port": n.Port()}))
	attackkit.CapProcess(t, srv.PID())
	w := tierWorker(t, srv, 1, "resp-hostile", harness.WorkerHidden)

	const chunks = 4
	base, peak := attackkit.PeakGrowth(t, srv.PID(), func() {
		if good, wrong := checkPrompt(t, w, 1, chunks); good != 0 || wrong != 0 {
			t.Fatalf("64 MiB values: %d good, %d wrong chunks served", good, wrong)
		}
	})
	t.Logf("a prompt of %d chunks over 64 MiB values: RSS %s -> peak %s (+%s), %d GETs answered",
		chunks, attackkit.MiB(base), attackkit.MiB(peak), attackkit.MiB(peak-base), n.Count("GET"))
	if n.Count("GET") == 0 {
		t.Fatal("the lookup asked for no value: the test tests nothing")
	}
	if peak-base > 16<<10 {
		t.Fatalf("RSS grew by %s reading %d values of 64 MiB, bound 16 MiB", attackkit.MiB(peak-base), chunks)
	}
	attackkit.Alive(t, srv, 5*time.Second, "64 MiB values")

	// A malformed reply marks the tier down (the log says why); a GET's
	// well-formed length of 1 TiB is a value of another length, a miss.
	for i, c := range []struct {
		exists, get, length string
		down                bool
	}{
		{"$-5\r\n", "$-1\r\n", "-5", true},
		{"$1099511627776\r\n", "$-1\r\n", "1099511627776", true},
		{":1\r\n", "$-5\r\n", "-5", true},
		{":1\r\n", "$1099511627776\r\n", "1099511627776", false},
	} {
		// From a tier that is up (the last reply marked it down).
		setReply(&exists, fakeresp.Int(0))
		poll.Until(t, 30*time.Second, "tier up", func() bool { return tier0(t, srv).State == "up" })
		setReply(&exists, []byte(c.exists))
		setReply(&get, []byte(c.get))
		downs := downFor(srv.Output(), c.length)
		base, peak := attackkit.PeakGrowth(t, srv.PID(), func() {
			if good, wrong := checkPrompt(t, w, 10+i, 2); good != 0 || wrong != 0 {
				t.Fatalf("EXISTS %q GET %q: %d good, %d wrong chunks served", c.exists, c.get, good, wrong)
			}
		})
		attackkit.Alive(t, srv, 5*time.Second, fmt.Sprintf("EXISTS answered %q, GET %q", c.exists, c.get))
		ts := tier0(t, srv)
		t.Logf("EXISTS %q, GET %q: kvdock alive, RSS +%s; tier %s (%s)", c.exists, c.get, attackkit.MiB(peak-base), ts.State, ts.Reason)
		if peak-base > 16<<10 {
			t.Fatalf("RSS grew by %s, bound 16 MiB", attackkit.MiB(peak-base))
		}
		// The probe (PING) may have brought the tier back already: the
		// log keeps the reason it went down.
		if went := downFor(srv.Output(), c.length) > downs; went != c.down {
			t.Fatalf("tier %s (%q); went down for the length %s: %t, want %t", ts.State, ts.Reason, c.length, went, c.down)
		}
		stillServing(t, w, 100+i)
	}

	setReply(&exists, fakeresp.Int(0))
	poll.Until(t, 30*time.Second, "tier up again", func() bool { return tier0(t, srv).State == "up" })
	stillServing(t, w, 200)
}

// TestHostileRESPRedirectLoop: a cluster node that redirects every key to
// itself. Lookups end, the tier goes down naming the loop, kvdock opens a
// bounded number of connections (open files stay under 128), and it keeps
// serving L1.
func TestHostileRESPRedirectLoop(t *testing.T) {
	var n *fakeresp.Node
	var addr atomic.Pointer[string]
	n = fakeresp.Start(t, func(cmd []string) []byte {
		if r := fakeresp.Basic(cmd); r != nil {
			return r
		}
		a := *addr.Load()
		switch {
		case cmd[0] == "CLUSTER" && len(cmd) > 1 && strings.EqualFold(cmd[1], "SLOTS"):
			return fakeresp.Slots(a)
		case cmd[0] == "CLUSTER":
			return fakeresp.Bulk([]byte("cluster_state:ok\r\n"))
		}
		return fakeresp.Err("MOVED 1 " + a)
	})
	a := n.Addr()
	addr.Store(&a)
	srv := harness.Start(t, "--chunk-size", "16", "--l2-adapter",
		tierAdapter(t, map[string]any{"type": "resp", "cluster": true, "startup_nodes": []string{a}}))
	attackkit.CapProcess(t, srv.PID())
	w := tierWorker(t, srv, 1, "resp-loop", harness.WorkerHidden)

	maxFDs := 0
	deadline := time.Now().Add(3 * time.Second)
	lookups := 0
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if _, _, err := tryPrompt(ctx, w, lookups, 2); err != nil {
			cancel()
			t.Fatalf("lookup %d: %v", lookups, err)
		}
		cancel()
		lookups++
		if fds, err := os.ReadDir("/proc/" + strconv.Itoa(srv.PID()) + "/fd"); err == nil {
			maxFDs = max(maxFDs, len(fds))
		}
	}
	ts := tier0(t, srv)
	t.Logf("%d lookups in 3 s: %d connections accepted (%d open), %d EXISTS, at most %d open files; tier %s (%s)",
		lookups, n.Accepted(), n.Open(), n.Count("EXISTS"), maxFDs, ts.State, ts.Reason)
	if n.Accepted() > 100 || maxFDs > 128 {
		t.Fatalf("%d connections accepted, %d open files at most", n.Accepted(), maxFDs)
	}
	if ts.State != "down" || !strings.Contains(ts.Reason, "redirect loop between "+a) {
		t.Fatalf("tier %s (%q), want down naming the loop at %s", ts.State, ts.Reason, a)
	}
	attackkit.Alive(t, srv, 5*time.Second, "a redirect loop")
	stillServing(t, w, 300)
}

// downFor counts the "resp tier down" lines of log for a malformed reply
// naming length.
func downFor(log, length string) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "resp tier down") && strings.Contains(line, "malformed reply") && strings.Contains(line, length) {
			n++
		}
	}
	return n
}

// scanPage is an HSCAN reply: cursor, then fields and values.
func scanPage(cursor string, kv ...string) []byte {
	b := []byte("*2\r\n")
	b = append(b, fakeresp.Bulk([]byte(cursor))...)
	b = append(b, fmt.Sprintf("*%d\r\n", len(kv))...)
	for _, s := range kv {
		b = append(b, fakeresp.Bulk([]byte(s))...)
	}
	return b
}

// shareNode is a node whose HSCAN of the share answers page(n) for the
// n-th HSCAN and MEMORY USAGE usage; the rest as a plain empty server.
func shareNode(t *testing.T, page func(n int64) []byte, usage int64) *fakeresp.Node {
	var scans atomic.Int64
	return fakeresp.Start(t, func(cmd []string) []byte {
		if r := fakeresp.Basic(cmd); r != nil {
			return r
		}
		switch cmd[0] {
		case "HSCAN":
			return page(scans.Add(1))
		case "MEMORY":
			return fakeresp.Int(usage)
		case "EXISTS":
			return fakeresp.Int(0)
		case "UNLINK", "DEL", "HDEL", "HSET", "EXPIRE":
			return fakeresp.Int(1)
		case "SET":
			return fakeresp.OK
		}
		return fakeresp.Err("ERR unknown command " + cmd[0])
	})
}

// cpuSeconds is the user and system CPU time pid used so far.
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// TestHostileRESPShareScan: the tier's start-up load of its own keys (an
// HSCAN of its share) against nodes that answer as no server would. A
// cursor that comes back ends the load at once, with the reason; fresh
// cursors forever end it after maxSharePages (2,048) pages; sizes of 2^62
// count at the largest a value takes; 262,144 listed keys of 1,000 bytes
// stop at the load's 64 MiB of key bytes. Each load ends within seconds,
// is not retried, and kvdock serves throughout.
func TestHostileRESPShareScan(t *testing.T) {
	start := func(t *testing.T, n *fakeresp.Node) *harness.Server {
		srv := harness.Start(t, "--chunk-size", "16", "--l2-adapter",
			tierAdapter(t, map[string]any{"type": "resp", "host": "127.0.0.1", "port": n.Port()}))
		attackkit.CapProcess(t, srv.PID())
		return srv
	}
	// The load logs "adopted" once it ends for good: a retried load
	// (the former answer to a bound) never gets there.
	ended := func(t *testing.T, srv *harness.Server, want string) {
		poll.Until(t, 30*time.Second, "the share load ends", func() bool {
			return strings.Contains(srv.Output(), "adopted this host's values of earlier runs")
		})
		if want != "" && !strings.Contains(srv.Output(), want) {
			t.Fatalf("the load ended without the reason %q:\n%s", want, attackkit.GrepLines(srv.Output(), "share"))
		}
	}
	t.Run("cursor repeats", func(t *testing.T) {
		n := shareNode(t, func(int64) []byte { return scanPage("7") }, 100)
		srv := start(t, n)
		ended(t, srv, "answered cursor 7 again")
		t.Logf("a cursor that comes back: %d HSCANs, %.2f CPU-s since the start", n.Count("HSCAN"), cpuSeconds(t, srv.PID()))
		if n.Count("HSCAN") > 2 {
			t.Fatalf("%d HSCANs for a cursor that came back at the second", n.Count("HSCAN"))
		}
		stillServingTier(t, srv)
	})
	t.Run("fresh cursors forever", func(t *testing.T) {
		n := shareNode(t, func(i int64) []byte { return scanPage(strconv.FormatInt(i, 10)) }, 100)
		srv := start(t, n)
		ended(t, srv, "not done after 2048 pages")
		t.Logf("fresh cursors: %d HSCANs, %.2f CPU-s since the start", n.Count("HSCAN"), cpuSeconds(t, srv.PID()))
		if n.Count("HSCAN") > 2048 {
			t.Fatalf("%d HSCANs, bound 2,048", n.Count("HSCAN"))
		}
		stillServingTier(t, srv)
	})
	t.Run("sizes of 2^62", func(t *testing.T) {
		n := shareNode(t, func(int64) []byte {
			return scanPage("0", "k1", "1700000000000", "k2", "1700000000000", "k3", "1700000000000")
		}, 1<<62)
		srv := start(t, n)
		ended(t, srv, "")
		ts := tier0(t, srv)
		t.Logf("3 keys of MEMORY USAGE 2^62: used_bytes %d of %d, %d objects", ts.UsedBytes, ts.CapacityBytes, ts.Objects)
		if ts.UsedBytes < 0 || ts.UsedBytes > ts.CapacityBytes {
			t.Fatalf("used_bytes %d, want 0..%d", ts.UsedBytes, ts.CapacityBytes)
		}
		stillServingTier(t, srv)
	})
	t.Run("262144 long keys", func(t *testing.T) {
		const keys, page = 262_144, 512
		pad := strings.Repeat("k", 990)
		n := shareNode(t, func(i int64) []byte {
			kv := make([]string, 0, 2*page)
			for j := range page {
				kv = append(kv, fmt.Sprintf("%s%09d", pad, (i-1)*page+int64(j)), "1700000000000")
			}
			next := strconv.FormatInt(i, 10)
			if i*page >= keys {
				next = "0"
			}
			return scanPage(next, kv...)
		}, 100)
		srv := start(t, n)
		base, peak := attackkit.PeakGrowth(t, srv.PID(), func() { ended(t, srv, "pass 67108864 bytes") })
		ts := tier0(t, srv)
		t.Logf("262,144 listed keys of 1,000 bytes: %d HSCANs, %d adopted; RSS %s -> peak %s (+%s)",
			n.Count("HSCAN"), ts.Objects, attackkit.MiB(base), attackkit.MiB(peak), attackkit.MiB(peak-base))
		if peak-base > 128<<10 {
			t.Fatalf("RSS grew by %s, bound 128 MiB", attackkit.MiB(peak-base))
		}
		stillServingTier(t, srv)
	})
}

// stillServingTier checks srv serves a worker through L1 beside the tier.
func stillServingTier(t *testing.T, srv *harness.Server) {
	t.Helper()
	attackkit.Alive(t, srv, 5*time.Second, "a hostile share")
	stillServing(t, tierWorker(t, srv, 1, "resp-share", harness.WorkerHidden), 400)
}

// TestHostileRESPMalformedReplyIsACountedMiss: a node answers EXISTS with a
// bulk of length -5 (valkey-go's reader panics in makeslice on it). The
// outcome is asserted, not a crash: kvdock's guard refuses the reply, the
// lookup answers its L1 hits (0 wrong chunks), the reply is counted
// corrupt and the chunk a miss, and the tier is down with the reason
// naming the length. Without the guard the tier's barrier catches the
// client's panic, and this test fails on the reason and the count.
func TestHostileRESPMalformedReplyIsACountedMiss(t *testing.T) {
	var exists, get atomic.Pointer[[]byte]
	setReply(&exists, fakeresp.Int(0))
	setReply(&get, []byte("$-1\r\n"))
	n := hostileNode(t, &exists, &get)
	srv := harness.Start(t, "--chunk-size", "16", "--l2-adapter",
		tierAdapter(t, map[string]any{"type": "resp", "host": "127.0.0.1", "port": n.Port()}))
	attackkit.CapProcess(t, srv.PID())
	w := tierWorker(t, srv, 1, "resp-malformed", harness.WorkerHidden)
	poll.Until(t, 30*time.Second, "tier up", func() bool { return tier0(t, srv).State == "up" })
	before := tier0(t, srv)
	setReply(&exists, []byte("$-5\r\n"))
	if good, wrong := checkPrompt(t, w, 1, 2); good != 0 || wrong != 0 {
		t.Fatalf("EXISTS answered $-5: %d good, %d wrong chunks served", good, wrong)
	}
	attackkit.Alive(t, srv, 5*time.Second, "EXISTS answered $-5")
	after := tier0(t, srv)
	t.Logf("EXISTS answered $-5: tier %s (%q), corrupt %d -> %d, misses %d -> %d",
		after.State, after.Reason, before.Corrupt, after.Corrupt, before.Misses, after.Misses)
	if after.Corrupt <= before.Corrupt {
		t.Errorf("the malformed reply was not counted corrupt (%d -> %d)", before.Corrupt, after.Corrupt)
	}
	if after.Misses <= before.Misses {
		t.Errorf("the lookup's tier miss was not counted (%d -> %d)", before.Misses, after.Misses)
	}
	// The probe may have brought the tier up again: the log keeps why it
	// went down.
	if downFor(srv.Output(), "-5") == 0 {
		t.Errorf("the tier did not go down for the malformed length -5:\n%s", attackkit.GrepLines(srv.Output(), "resp tier"))
	}
	setReply(&exists, fakeresp.Int(0))
	poll.Until(t, 30*time.Second, "tier up again", func() bool { return tier0(t, srv).State == "up" })
	stillServing(t, w, 500)
}
