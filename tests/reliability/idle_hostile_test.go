package reliability

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/tests/harness"
	"kvdock/tests/harness/attackkit"
)

// zmtpGreeting is the first half of a ZMTP 3.0 greeting (signature and
// major version): a peer that sends it has started a handshake it never ends.
var zmtpGreeting = []byte{0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3}

// zmtpHandshake is a whole ZMTP 3.0 NULL handshake as a DEALER: the
// 64-byte greeting and a READY command. A peer that sends it is a
// connected ZMQ socket to the server, idle until it sends a message.
var zmtpHandshake = func() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	body := []byte("\x05READY\x0bSocket-Type\x00\x00\x00\x06DEALER")
	return append(append(g, 0x04, byte(len(body))), body...)
}()

// idleFlood opens n TCP connections to the server's ZMQ port, every second
// one sending a partial ZMTP greeting, the others nothing, and keeps them
// open (unread) until the test ends. It returns how many connected.
func idleFlood(t *testing.T, srv *harness.Server, n int, hello func(i int) []byte) int {
	t.Helper()
	addr := strings.TrimPrefix(srv.Endpoint, "tcp://")
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var c net.Conn
			var err error
			for range 3 { // a full accept queue drops SYNs; the kernel retries once a second
				if c, err = net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
					break
				}
			}
			if err != nil {
				return // the server ran out of files and its accept queue is full
			}
			c.Write(hello(i))
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return len(conns)
}

// checkHandshake fails unless the server answers zmtpHandshake with its
// own greeting and keeps the connection open (the server accepted the peer
// as a ZMQ socket).
func checkHandshake(t *testing.T, srv *harness.Server) {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(srv.Endpoint, "tcp://"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(zmtpHandshake); err != nil {
		t.Fatal(err)
	}
	got := 0
	buf := make([]byte, 256)
	c.SetReadDeadline(time.Now().Add(1500 * time.Millisecond))
	for {
		n, err := c.Read(buf)
		got += n
		if err != nil {
			if ne, ok := err.(net.Error); !ok || !ne.Timeout() || got < 64 {
				t.Fatalf("the server did not keep a peer that finished the handshake: read %d bytes, then %v", got, err)
			}
			return
		}
	}
}

// settledFDs waits until the server's file count has not changed for half a
// second (it has accepted what it can), at most 5 s, and returns it.
func settledFDs(t *testing.T, pid int) int {
	t.Helper()
	last, since := fdCount(t, pid), time.Now()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && time.Since(since) < 500*time.Millisecond; {
		time.Sleep(50 * time.Millisecond)
		if n := fdCount(t, pid); n != last {
			last, since = n, time.Now()
		}
	}
	return last
}

// answeredWithin reports how long until a fresh worker's NOOP was answered,
// trying until limit; ok is false if it never was.
func answeredWithin(t *testing.T, srv *harness.Server, since time.Time, limit time.Duration) (time.Duration, bool) {
	t.Helper()
	for time.Since(since) < limit {
		c, err := client.Dial(srv.Endpoint, harness.Profile(t, srv.Protocol), client.Options{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		r, err := c.Call(context.Background(), protocol.Noop)
		c.Close()
		if err == nil && r.Present {
			return time.Since(since), true
		}
	}
	return time.Since(since), false
}

// Peers that connect to the ZMQ port and say nothing (or start a ZMTP
// greeting and stop) each hold one of the server's files and some memory
// in libzmq until the handshake deadline drops them (libzmq's default is
// 30 s; kvdock sets 5 s). With more of them than the server has files, a
// real worker cannot even be accepted until they go: the bound is how long
// they stay, so the files they hold are at most those opened within it.
func TestHostileIdlePeers(t *testing.T) {
	srv := attackkit.StartAttacked(t) // 1,024 files
	pid := srv.PID()
	attackkit.Alive(t, srv, 5*time.Second, "start")
	baseFDs, baseRSS := fdCount(t, pid), attackkit.ProcKiB(t, pid, "VmRSS")
	const n = 1100 // more than the server's 1,024 files
	start := time.Now()
	connected := idleFlood(t, srv, n, func(i int) []byte {
		if i%2 == 1 {
			return zmtpGreeting
		}
		return nil
	})
	flooded := time.Now()
	peakFDs, peakRSS := settledFDs(t, pid), attackkit.ProcKiB(t, pid, "VmRSS")
	held := peakFDs - baseFDs
	perPeer := int64(0)
	if held > 0 {
		perPeer = (peakRSS - baseRSS) * attackkit.KiB / int64(held)
	}
	t.Logf("%d of %d idle peers connected in %v; server files %d → %d (+%d), RSS %s → %s: %d bytes and 1 file per idle peer",
		connected, n, time.Since(start).Round(time.Millisecond), baseFDs, peakFDs, held, attackkit.MiB(baseRSS), attackkit.MiB(peakRSS), perPeer)

	// From the last connection: the 5 s handshake deadline, once more for
	// the peers accepted late from the full accept queue, and margin.
	const limit = 12 * time.Second
	took, ok := answeredWithin(t, srv, flooded, limit)
	if !ok {
		t.Errorf("with %d idle peers connected, a worker's NOOP was not answered within %v (server files %d of 1,024)",
			connected, limit, fdCount(t, pid))
	} else {
		t.Logf("a worker's NOOP answered %v after the idle peers connected", took.Round(time.Millisecond))
	}
	var nowFDs int
	waitUntil := flooded.Add(limit)
	for {
		nowFDs = fdCount(t, pid)
		if nowFDs <= baseFDs+16 || time.Now().After(waitUntil) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("server files %v after the idle peers connected: %d (base %d)", time.Since(flooded).Round(time.Millisecond), nowFDs, baseFDs)
	if nowFDs > baseFDs+16 {
		t.Errorf("idle peers still hold %d of the server's files %v after they connected", nowFDs-baseFDs, limit)
	}
	if perPeer > 64*attackkit.KiB {
		t.Errorf("an idle peer costs %d bytes of server memory, bound 64 KiB", perPeer)
	}
	attackkit.Alive(t, srv, 5*time.Second, fmt.Sprintf("%d idle peers", connected))

	// Peers that finish the handshake are ZMQ sockets like idle workers and
	// stay: each costs one file and a bounded few KiB in libzmq.
	const m = 400
	checkHandshake(t, srv)
	baseFDs, baseRSS = fdCount(t, pid), attackkit.ProcKiB(t, pid, "VmRSS")
	connected = idleFlood(t, srv, m, func(int) []byte { return zmtpHandshake })
	// The server accepts in the background, and a loaded machine may pause
	// it longer than settledFDs' quiet half second: first wait (failure-only
	// limit) for the count the check below wants at least.
	for end := time.Now().Add(15 * time.Second); fdCount(t, pid)-baseFDs < m*9/10 && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	peakFDs, peakRSS = settledFDs(t, pid), attackkit.ProcKiB(t, pid, "VmRSS")
	held = peakFDs - baseFDs
	if held > 0 {
		perPeer = (peakRSS - baseRSS) * attackkit.KiB / int64(held)
	}
	t.Logf("%d peers that finished the handshake and went idle: server files +%d, RSS %s → %s: %d bytes per peer",
		connected, held, attackkit.MiB(baseRSS), attackkit.MiB(peakRSS), perPeer)
	if held < m*9/10 || held > m+16 {
		t.Errorf("%d handshaken idle peers hold %d files: want one each", m, held)
	}
	if perPeer > 64*attackkit.KiB {
		t.Errorf("a handshaken idle peer costs %d bytes of server memory, bound 64 KiB", perPeer)
	}
	attackkit.Alive(t, srv, 5*time.Second, fmt.Sprintf("%d handshaken idle peers", connected))
	t.Logf("attack done %v after it began", time.Since(start).Round(time.Millisecond))
}
