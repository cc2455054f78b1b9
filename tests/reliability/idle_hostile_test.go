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
)

// zmtpGreeting is the first half of a ZMTP 3.0 greeting (signature and
// major version): a peer that sends it has started a handshake it never ends.
var zmtpGreeting = []byte{0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3}

// idleFlood opens n TCP connections to the server's ZMQ port, every second
// one sending a partial ZMTP greeting, the others nothing, and keeps them
// open (unread) until the test ends. It returns how many connected.
func idleFlood(t *testing.T, srv *harness.Server, n int) int {
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
			if i%2 == 1 {
				c.Write(zmtpGreeting)
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return len(conns)
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
	srv := startAttacked(t) // 1,024 files
	pid := srv.PID()
	alive(t, srv, 5*time.Second, "start")
	baseFDs, baseRSS := fdCount(t, pid), procKiB(t, pid, "VmRSS")
	const n = 1100 // more than the server's 1,024 files
	start := time.Now()
	connected := idleFlood(t, srv, n)
	time.Sleep(300 * time.Millisecond) // let the server accept what it can
	peakFDs, peakRSS := fdCount(t, pid), procKiB(t, pid, "VmRSS")
	held := peakFDs - baseFDs
	perPeer := int64(0)
	if held > 0 {
		perPeer = (peakRSS - baseRSS) * kib / int64(held)
	}
	t.Logf("%d of %d idle peers connected in %v; server files %d → %d (+%d), RSS %s → %s: %d bytes and 1 file per idle peer",
		connected, n, time.Since(start).Round(time.Millisecond), baseFDs, peakFDs, held, mib(baseRSS), mib(peakRSS), perPeer)

	const limit = 10 * time.Second // the 5 s handshake deadline and margin
	took, ok := answeredWithin(t, srv, start, limit)
	if !ok {
		t.Errorf("with %d idle peers connected, a worker's NOOP was not answered within %v (server files %d of 1,024)",
			connected, limit, fdCount(t, pid))
	} else {
		t.Logf("a worker's NOOP answered %v after the idle peers began", took.Round(time.Millisecond))
	}
	var nowFDs int
	waitUntil := start.Add(limit)
	for {
		nowFDs = fdCount(t, pid)
		if nowFDs <= baseFDs+16 || time.Now().After(waitUntil) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("server files %v after the idle peers began: %d (base %d)", time.Since(start).Round(time.Millisecond), nowFDs, baseFDs)
	if nowFDs > baseFDs+16 {
		t.Errorf("idle peers still hold %d of the server's files %v after they connected", nowFDs-baseFDs, limit)
	}
	if perPeer > 64*kib {
		t.Errorf("an idle peer costs %d bytes of server memory, bound 64 KiB", perPeer)
	}
	alive(t, srv, 5*time.Second, fmt.Sprintf("%d idle peers", connected))
}
