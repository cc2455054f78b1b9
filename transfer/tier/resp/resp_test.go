package resp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kvdock/core/testkit/logbuf"
	"kvdock/core/testkit/redisserver"
	"kvdock/core/tierstate"
	"kvdock/transfer/tier"
)

// stateLimit bounds how long a state change may take to show: the down
// mark is immediate on the failing call, the way back takes the probe's
// backoff (at most 5 s) plus a reconnect.
const stateLimit = 15 * time.Second

func standaloneCfg(s *redisserver.Server) RESPConfig {
	return RESPConfig{Host: "127.0.0.1", Port: s.Port, NumWorkers: 8, CapacityBytes: 1 << 30, KeyPrefix: DefaultKeyPrefix}
}

// startTier starts a standalone Redis and opens a tier on it with
// standaloneCfg.
func startTier(t *testing.T) (*Tier, *redisserver.Server) {
	t.Helper()
	s := redisserver.Start(t, redisserver.Options{})
	tr, lb := open(t, standaloneCfg(s))
	// The tier loads this host's share in the background from Open on; a
	// test that kills the server would otherwise kill that load too, at a
	// moment of its own choosing, and see the tier (rightly) down.
	if err := lb.Wait("adopted this host's values", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return tr, s
}

func open(t *testing.T, cfg RESPConfig) (*Tier, *logbuf.Buffer) {
	t.Helper()
	lb := &logbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr, err := Open(ctx, cfg, log)
	if err != nil {
		t.Fatalf("Open(%v): %v", cfg, err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr, lb
}

func value(seed, n int) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

// model-like keys: '/', ':', '@' and a brace must all be fine.
func key(i int) string {
	return fmt.Sprintf("%064x@org/model:{v1}@%08x", i, i%4)
}

func roundTrip(t *testing.T, tr *Tier, n int) {
	t.Helper()
	ctx := context.Background()
	sizes := []int{1, 4096, 128 << 10, 3 << 20}
	var keys []string
	for i := range n {
		k := key(i)
		keys = append(keys, k)
		if err := putEither(ctx, tr, i, k, value(i, sizes[i%len(sizes)])); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	for i, k := range keys {
		got, err := tr.Get(ctx, k)
		if err != nil {
			t.Fatalf("Get %d: %v", i, err)
		}
		if !bytes.Equal(got, value(i, sizes[i%len(sizes)])) {
			t.Fatalf("Get %d: %d bytes differ from the %d stored", i, len(got), sizes[i%len(sizes)])
		}
	}
	if h, err := tr.Has(ctx, keys); err != nil || h != n {
		t.Fatalf("Has(all) = %d, %v; want %d", h, err, n)
	}
	if err := tr.Delete(ctx, keys[n/2]); err != nil {
		t.Fatal(err)
	}
	if err := tr.Delete(ctx, keys[n/2]); err != nil {
		t.Fatalf("Delete of an absent key: %v", err)
	}
	if h, err := tr.Has(ctx, keys); err != nil || h != n/2 {
		t.Fatalf("Has after deleting key %d = %d, %v; want %d leading", n/2, h, err, n/2)
	}
	if _, err := tr.Get(ctx, keys[n/2]); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("Get of a deleted key: %v, want ErrNotFound", err)
	}
	if h, err := tr.Has(ctx, nil); err != nil || h != 0 {
		t.Fatalf("Has(nil) = %d, %v", h, err)
	}
	st := tr.Stats()
	if st.Type != "resp" || st.State != tierstate.Up || st.Objects != int64(n-1) || st.WriteBytes == 0 || st.ReadBytes == 0 {
		t.Fatalf("Stats = %+v", st)
	}
}

// putEither stores v under k through Put for even i, through PutParts (the
// write-behind's way, head and payload apart) for odd i.
func putEither(ctx context.Context, tr *Tier, i int, k string, v []byte) error {
	if i%2 == 0 {
		return tr.Put(ctx, k, v)
	}
	h := min(len(v), 7)
	return tr.PutParts(ctx, k, v[:h], v[h:], func() bool { return true }, func() {})
}

func TestRoundTripStandalone(t *testing.T) {
	tr, s := startTier(t)
	roundTrip(t, tr, 16)
	if got := tr.Stats().Target; got != s.Addr {
		t.Fatalf("Target = %q, want %q", got, s.Addr)
	}
}

func TestRoundTripCluster(t *testing.T) {
	c := redisserver.StartCluster(t, 3)
	cfg := RESPConfig{Cluster: true, StartupNodes: c.Addrs()[:2], NumWorkers: 4, CapacityBytes: 1 << 30, KeyPrefix: "kv:"}
	tr, _ := open(t, cfg)
	roundTrip(t, tr, 48)
	if got, want := tr.Stats().Target, "cluster "+strings.Join(c.Addrs()[:2], ","); got != want {
		t.Fatalf("Target = %q, want %q", got, want)
	}
	// The keys really spread over the nodes (else this is no cluster test).
	ctx := context.Background()
	spread := 0
	for _, n := range c.Nodes {
		if v, err := n.Do(ctx, "DBSIZE"); err == nil && v != "0" {
			spread++
		}
	}
	if spread < 2 {
		t.Fatalf("keys landed on %d of 3 nodes", spread)
	}
}

func TestTTL(t *testing.T) {
	s := redisserver.Start(t, redisserver.Options{})
	cfg := standaloneCfg(s)
	cfg.TTL = 100 * time.Second
	tr, _ := open(t, cfg)
	ctx := context.Background()
	if err := tr.Put(ctx, key(1), value(1, 10)); err != nil {
		t.Fatal(err)
	}
	ttl, err := s.Do(ctx, "PTTL", tr.serverKey(key(1)))
	if err != nil {
		t.Fatal(err)
	}
	if ms, _ := strconv.Atoi(ttl); ms <= 0 || ms > 100_000 {
		t.Fatalf("PTTL = %s ms, want in (0, 100000]", ttl)
	}
	if err := putEither(ctx, tr, 3, key(3), value(3, 10)); err != nil {
		t.Fatal(err)
	}
	if ttl, err := s.Do(ctx, "PTTL", tr.serverKey(key(3))); err != nil {
		t.Fatal(err)
	} else if ms, _ := strconv.Atoi(ttl); ms <= 0 || ms > 100_000 {
		t.Fatalf("PTTL of a streamed value = %s ms, want in (0, 100000]", ttl)
	}
	cfg.TTL = 0
	tr2, _ := open(t, cfg)
	if err := tr2.Put(ctx, key(2), value(2, 10)); err != nil {
		t.Fatal(err)
	}
	if ttl, err := s.Do(ctx, "PTTL", tr.serverKey(key(2))); err != nil || ttl != "-1" {
		t.Fatalf("PTTL without ttl_seconds = %s, %v; want -1 (no expiry)", ttl, err)
	}
}

func TestKeyPrefixIsolation(t *testing.T) {
	s := redisserver.Start(t, redisserver.Options{})
	cfgA, cfgB := standaloneCfg(s), standaloneCfg(s)
	cfgA.KeyPrefix, cfgB.KeyPrefix = "hostA:", "hostB:"
	a, _ := open(t, cfgA)
	b, _ := open(t, cfgB)
	ctx := context.Background()
	if err := a.Put(ctx, key(7), value(7, 100)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, key(7)); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("prefix B sees prefix A's value: %v", err)
	}
	if h, err := b.Has(ctx, []string{key(7)}); err != nil || h != 0 {
		t.Fatalf("prefix B Has = %d, %v", h, err)
	}
	if v, err := s.Do(ctx, "EXISTS", a.serverKey(key(7))); err != nil || v != "1" {
		t.Fatalf("the server lacks hostA:key: %s, %v", v, err)
	}
	if err := b.Put(ctx, key(7), value(8, 100)); err != nil {
		t.Fatal(err)
	}
	got, err := a.Get(ctx, key(7))
	if err != nil || !bytes.Equal(got, value(7, 100)) {
		t.Fatalf("prefix B's write changed prefix A's value: %v", err)
	}
}

func TestCapacityEvictsOwnLRU(t *testing.T) {
	s := redisserver.Start(t, redisserver.Options{})
	cfg := standaloneCfg(s)
	cfg.CapacityBytes = 1 << 20
	tr, _ := open(t, cfg)
	ctx := context.Background()
	// 224 KiB on the server each (MEMORY USAGE): four fit in 1 MiB, five do not.
	const size = 200 << 10
	for i := range 4 {
		if err := tr.Put(ctx, key(i), value(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	// A hit makes key 0 the most recently used: key 1 is evicted first.
	if _, err := tr.Get(ctx, key(0)); err != nil {
		t.Fatal(err)
	}
	if err := tr.Put(ctx, key(4), value(4, size)); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"1", "0", "1", "1", "1"} {
		if v, err := s.Do(ctx, "EXISTS", tr.serverKey(key(i))); err != nil || v != want {
			t.Fatalf("EXISTS key %d = %s, %v; want %s", i, v, err, want)
		}
	}
	if st := tr.Stats(); st.UsedBytes > cfg.CapacityBytes || st.Objects != 4 {
		t.Fatalf("used %d of %d, %d objects; want ≤ capacity, 4", st.UsedBytes, cfg.CapacityBytes, st.Objects)
	}
	if err := tr.Put(ctx, key(9), make([]byte, 2<<20)); err == nil {
		t.Fatal("a value larger than the capacity was accepted")
	}
	if v, _ := s.Do(ctx, "EXISTS", tr.serverKey(key(9))); v != "0" {
		t.Fatal("the refused value reached the server")
	}
}

func TestWrongPasswordIsClearAndSecret(t *testing.T) {
	const real, wrong = "real-secret-4d1f", "wrong-secret-9a7c"
	s := redisserver.Start(t, redisserver.Options{Password: real})
	cfg := standaloneCfg(s)
	cfg.Password = wrong
	lb := &logbuf.Buffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr, err := Open(ctx, cfg, slog.New(slog.NewTextHandler(lb, nil)))
	if err == nil {
		_ = tr.Close()
		t.Fatal("Open with a wrong password succeeded")
	}
	msg := err.Error()
	if !strings.Contains(msg, "WRONGPASS") || !strings.Contains(msg, s.Addr) {
		t.Fatalf("error %q does not say the password was refused and where", msg)
	}
	for _, secret := range []string{real, wrong} {
		if strings.Contains(msg, secret) || strings.Contains(lb.String(), secret) {
			t.Fatalf("a password leaked: error %q, log %q", msg, lb.String())
		}
	}
	cfg.Password = real
	tr, _ = open(t, cfg)
	if err := tr.Put(ctx, key(1), value(1, 10)); err != nil {
		t.Fatalf("the right password: %v", err)
	}
	if err := putEither(ctx, tr, 1, key(2), value(2, 10)); err != nil {
		t.Fatalf("the right password, streamed: %v", err)
	}
	for i := 1; i <= 2; i++ {
		if got, err := tr.Get(ctx, key(i)); err != nil || !bytes.Equal(got, value(i, 10)) {
			t.Fatalf("Get %d: %v", i, err)
		}
	}
}

// TestServerKilledAndRestarted: SIGKILL mid-traffic marks the tier down
// with a reason, calls fail fast, no call returns wrong bytes, and the tier
// comes back by itself once the server listens again on the same port.
func TestServerKilledAndRestarted(t *testing.T) {
	const pw = "kill-test-secret-77"
	s := redisserver.Start(t, redisserver.Options{Password: pw})
	cfg := standaloneCfg(s)
	cfg.Password = pw
	tr, lb := open(t, cfg)
	ctx := context.Background()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var wrong sync.Map
	first := make(chan struct{})
	var once sync.Once
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := key(w*1_000_000+i%32), value(w*1_000_000+i%32, 64<<10)
				if tr.Put(ctx, k, v) != nil {
					// Down: calls fail at once; pace the loop, not order it.
					select {
					case <-stop:
						return
					case <-time.After(10 * time.Millisecond):
					}
					continue
				}
				got, err := tr.Get(ctx, k)
				if err == nil {
					once.Do(func() { close(first) })
					if !bytes.Equal(got, v) {
						wrong.Store(k, len(got))
					}
				}
			}
		}()
	}
	select {
	case <-first:
	case <-time.After(stateLimit):
		t.Fatal("no traffic got through before the kill")
	}
	killed := time.Now()
	s.Kill()
	if err := lb.Wait("resp tier down", stateLimit); err != nil {
		t.Fatalf("no down state after SIGKILL: %v\n%s", err, lb.String())
	}
	toDown := time.Since(killed)
	st := tr.Stats()
	if st.State != tierstate.Down || st.Reason == "" || strings.Contains(st.Reason, pw) {
		t.Fatalf("after SIGKILL: state %q reason %q", st.State, st.Reason)
	}
	t0 := time.Now()
	_, err := tr.Get(ctx, key(1))
	if !errors.Is(err, ErrDown) || time.Since(t0) > time.Second {
		t.Fatalf("Get while down: %v after %v; want ErrDown at once", err, time.Since(t0))
	}
	if err := tr.Put(ctx, key(1), value(1, 10)); !errors.Is(err, ErrDown) {
		t.Fatalf("Put while down: %v", err)
	}
	if _, err := tr.Has(ctx, []string{key(1)}); !errors.Is(err, ErrDown) {
		t.Fatalf("Has while down: %v", err)
	}
	failFast := time.Since(t0)
	restarted := time.Now()
	s.Restart()
	if err := lb.Wait("resp tier up", stateLimit); err != nil {
		t.Fatalf("the tier did not come back by itself: %v\n%s", err, lb.String())
	}
	t.Logf("down %v after SIGKILL (reason %q); calls while down fail in %v; up %v after the restart",
		toDown, st.Reason, failFast, time.Since(restarted))
	close(stop)
	wg.Wait()
	wrong.Range(func(k, n any) bool {
		t.Errorf("key %v: %v wrong bytes served", k, n)
		return true
	})
	if err := tr.Put(ctx, key(5), value(5, 128<<10)); err != nil {
		t.Fatalf("Put after restart: %v", err)
	}
	if got, err := tr.Get(ctx, key(5)); err != nil || !bytes.Equal(got, value(5, 128<<10)) {
		t.Fatalf("Get after restart: %v", err)
	}
	if st := tr.Stats(); st.State != tierstate.Up || st.Reason != "" {
		t.Fatalf("after restart: %+v", st)
	}
	if strings.Contains(lb.String(), pw) {
		t.Fatal("the password is in the log")
	}
}

// TestStartsDownThenUp: an unreachable server at Open is no error; the tier
// starts down and comes up by itself when the server appears.
func TestStartsDownThenUp(t *testing.T) {
	port, err := redisserver.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg := RESPConfig{Host: "127.0.0.1", Port: port, NumWorkers: 2, CapacityBytes: 1 << 30, KeyPrefix: "x:"}
	tr, lb := open(t, cfg)
	if st := tr.Stats(); st.State != tierstate.Down || st.Reason == "" {
		t.Fatalf("no server: %+v", st)
	}
	if _, err := tr.Get(context.Background(), key(1)); !errors.Is(err, ErrDown) {
		t.Fatalf("Get with no server: %v", err)
	}
	redisserver.Start(t, redisserver.Options{Port: port})
	if err := lb.Wait("resp tier up", stateLimit); err != nil {
		t.Fatalf("never came up: %v\n%s", err, lb.String())
	}
	if err := tr.Put(context.Background(), key(1), value(1, 10)); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentCallsAndClose(t *testing.T) {
	s := redisserver.Start(t, redisserver.Options{})
	cfg := standaloneCfg(s)
	cfg.NumWorkers = 3
	tr, _ := open(t, cfg)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				k, v := key(w*100+i), value(w*100+i, 1000+w*i)
				if err := tr.Put(ctx, k, v); err != nil {
					errs <- err
					return
				}
				got, err := tr.Get(ctx, k)
				if err != nil || !bytes.Equal(got, v) {
					errs <- fmt.Errorf("key %d: %v (equal=%t)", w*100+i, err, bytes.Equal(got, v))
					return
				}
				if _, err := tr.Has(ctx, []string{k, key(-1)}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Put(ctx, key(1), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Put after Close: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestServerKeyDefusesHashTags(t *testing.T) {
	for _, c := range []struct{ prefix, key, want string }{
		{"kvdock:", "ab@org/m@00000000", "kvdock:ab@org/m@00000000"},
		{"kvdock:", "ab@org/{m}@00000000", "{}kvdock:ab@org/{m}@00000000"},
		{"{pinned}:", "ab@org/{m}@00000000", "{pinned}:ab@org/{m}@00000000"},
	} {
		tr := &Tier{cfg: RESPConfig{KeyPrefix: c.prefix}}
		if got := tr.serverKey(c.key); got != c.want {
			t.Errorf("serverKey(%q, %q) = %q, want %q", c.prefix, c.key, got, c.want)
		}
	}
}

// TestPutNeverReadsValueAfterReturn: the caller may reuse value's memory
// once Put returns, even when Put gave up on the caller's deadline; the
// server must then hold the original bytes or nothing, never the reuse.
func TestPutNeverReadsValueAfterReturn(t *testing.T) {
	tr, _ := startTier(t)
	const size = 1 << 20
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, size)
			for i := range 8 {
				id := w*100 + i
				copy(buf, value(id, size))
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+i)*time.Millisecond)
				if err := tr.Put(ctx, key(id), buf); err != nil {
					t.Logf("put %d: %v", id, err)
				}
				cancel()
				for j := range buf {
					buf[j] = 0xEE // the caller reuses its buffer
				}
			}
		}()
	}
	wg.Wait()
	ctx := context.Background()
	for w := range 8 {
		for i := range 8 {
			id := w*100 + i
			got, err := tr.Get(ctx, key(id))
			if errors.Is(err, tier.ErrNotFound) {
				continue
			}
			if err != nil {
				t.Fatalf("Get %d: %v", id, err)
			}
			if !bytes.Equal(got, value(id, size)) {
				t.Fatalf("key %d holds bytes other than those Put was given (the buffer was read after Put returned)", id)
			}
		}
	}
}

// TestImpatientCallerHarmsNoOther: a caller whose deadline ends mid-call
// gets its error at once, but the connection every call shares is not torn
// down under the others, and the tier stays up.
func TestImpatientCallerHarmsNoOther(t *testing.T) {
	s := redisserver.Start(t, redisserver.Options{})
	tr, lb := open(t, standaloneCfg(s))
	ctx := context.Background()
	const size = 2 << 20
	for i := range 4 {
		if err := tr.Put(ctx, key(i), value(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	impatient := make(chan int)
	go func() {
		n := 0
		defer func() { impatient <- n }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			short, cancel := context.WithTimeout(ctx, time.Duration(1+i%3)*time.Millisecond)
			t0 := time.Now()
			if _, err := tr.Get(short, key(i%4)); err != nil {
				n++
			}
			if _, err := tr.Has(short, []string{key(i % 4)}); err != nil {
				n++
			}
			if d := time.Since(t0); d > 2*time.Second {
				t.Errorf("a call with a 1..3 ms deadline took %v", d)
			}
			cancel()
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 8 {
				k := (w + i) % 4
				got, err := tr.Get(ctx, key(k))
				if err != nil || !bytes.Equal(got, value(k, size)) {
					errs <- fmt.Errorf("patient Get %d: %v", k, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	n := <-impatient
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := tr.Stats(); st.State != tierstate.Up || strings.Contains(lb.String(), "resp tier down") {
		t.Errorf("impatient callers marked the tier %s: %s", st.State, lb.String())
	}
	t.Logf("%d impatient calls gave up", n)
}

func TestTLS(t *testing.T) {
	files := redisserver.NewTLS(t)
	s := redisserver.Start(t, redisserver.Options{TLS: files})
	cfg := standaloneCfg(s)
	cfg.TLS, cfg.CAFile = true, files.CAFile
	// A TLS handshake on a loaded 2-core machine can outlast the 2 s default.
	cfg.DialTimeout = 20 * time.Second
	tr, _ := open(t, cfg)
	roundTrip(t, tr, 8)

	// Without our CA the server's certificate is refused: the tier is
	// down and says why; so is a plain connection to the TLS port.
	cfg.CAFile = ""
	untrusted, _ := open(t, cfg)
	if st := untrusted.Stats(); st.State != tierstate.Down || !strings.Contains(st.Reason, "certificate") {
		t.Fatalf("untrusted certificate: %+v", st)
	}
	cfg.TLS = false
	plain, _ := open(t, cfg)
	if st := plain.Stats(); st.State != tierstate.Down || st.Reason == "" {
		t.Fatalf("plain client on a TLS port: %+v", st)
	}
}

// TestServerOutOfMemoryDegrades: a server refusing writes (maxmemory,
// noeviction) makes the tier degraded with the reason, reads go on, and a
// write that succeeds again clears it.
func TestServerOutOfMemoryDegrades(t *testing.T) {
	s := redisserver.Start(t, redisserver.Options{Args: []string{"--maxmemory", "3mb", "--maxmemory-policy", "noeviction"}})
	tr, lb := open(t, standaloneCfg(s))
	ctx := context.Background()
	if err := tr.Put(ctx, key(1), value(1, 1000)); err != nil {
		t.Fatal(err)
	}
	var err error
	for i := 2; err == nil && i < 10; i++ {
		err = tr.Put(ctx, key(i), value(i, 1<<20))
	}
	if err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("filling a 3 MB server: %v", err)
	}
	if st := tr.Stats(); st.State != tierstate.Degraded || !strings.Contains(st.Reason, "out of memory") {
		t.Fatalf("after OOM: %+v", st)
	}
	if got, err := tr.Get(ctx, key(1)); err != nil || !bytes.Equal(got, value(1, 1000)) {
		t.Fatalf("Get while degraded: %v", err)
	}
	if _, err := s.Do(ctx, "FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	if err := tr.Put(ctx, key(1), value(1, 1000)); err != nil {
		t.Fatal(err)
	}
	if st := tr.Stats(); st.State != tierstate.Up || st.Reason != "" {
		t.Fatalf("after a write succeeded again: %+v", st)
	}
	if err := lb.Wait("resp tier up", time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestForeignValueUnderOurKey: something else stored under one of our keys
// (here a hash) is an error for that call only; the tier stays up.
func TestForeignValueUnderOurKey(t *testing.T) {
	tr, s := startTier(t)
	ctx := context.Background()
	if _, err := s.Do(ctx, "HSET", tr.serverKey(key(3)), "f", "v"); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Get(ctx, key(3)); err == nil || errors.Is(err, tier.ErrNotFound) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("Get of a hash: %v", err)
	}
	if st := tr.Stats(); st.State != tierstate.Up {
		t.Fatalf("a foreign value changed the tier's state: %+v", st)
	}
	if err := tr.Put(ctx, key(3), value(3, 100)); err != nil {
		t.Fatalf("Put over the foreign value: %v", err)
	}
	if got, err := tr.Get(ctx, key(3)); err != nil || !bytes.Equal(got, value(3, 100)) {
		t.Fatalf("Get after overwrite: %v", err)
	}
}

// TestClusterNodeKilledAndRestarted: one of three cluster nodes SIGKILLed
// takes the tier down with the reason (its slots are gone), and the tier
// comes back by itself once the node is back with its slots.
func TestClusterNodeKilledAndRestarted(t *testing.T) {
	c := redisserver.StartCluster(t, 3)
	tr, lb := open(t, RESPConfig{Cluster: true, StartupNodes: c.Addrs(), NumWorkers: 4, CapacityBytes: 1 << 30, KeyPrefix: "kv:"})
	ctx := context.Background()
	for i := range 32 {
		if err := tr.Put(ctx, key(i), value(i, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	c.Nodes[1].Kill()
	// Keys on the dead node fail; the first failure marks the tier down.
	for i := 0; i < 32 && tr.Stats().State == tierstate.Up; i++ {
		_, _ = tr.Get(ctx, key(i))
	}
	if err := lb.Wait("resp tier down", stateLimit); err != nil {
		t.Fatalf("no down state after a node's SIGKILL: %v", err)
	}
	if st := tr.Stats(); st.State != tierstate.Down || st.Reason == "" {
		t.Fatalf("after a node's SIGKILL: %+v", st)
	}
	t0 := time.Now()
	if _, err := tr.Get(ctx, key(0)); !errors.Is(err, ErrDown) || time.Since(t0) > time.Second {
		t.Fatalf("Get while down: %v after %v", err, time.Since(t0))
	}
	c.Nodes[1].Restart()
	if err := lb.Wait("resp tier up", 2*stateLimit); err != nil {
		t.Fatalf("the tier did not come back: %v", err)
	}
	// The restarted node is empty (no persistence): its keys are misses,
	// the others' are hits with the right bytes, none is wrong.
	hits := 0
	for i := range 32 {
		got, err := tr.Get(ctx, key(i))
		switch {
		case errors.Is(err, tier.ErrNotFound):
		case err != nil:
			t.Fatalf("Get %d after the node came back: %v", i, err)
		case !bytes.Equal(got, value(i, 1000)):
			t.Fatalf("key %d: wrong bytes", i)
		default:
			hits++
		}
	}
	if hits == 0 || hits == 32 {
		t.Fatalf("%d of 32 hits after one of 3 nodes lost its data", hits)
	}
}

// TestLookupNotBehindWrites: the small commands (EXISTS, DEL) have their
// own connections, so a lookup answers while a value's SET is stuck on the
// server (writes paused with CLIENT PAUSE WRITE, as a 32 MiB SET holds its
// pipeline while it crosses the socket) instead of queueing behind it.
func TestLookupNotBehindWrites(t *testing.T) {
	tr, s := startTier(t)
	ctx := context.Background()
	var present []string
	for i := range 64 {
		present = append(present, key(1000+i))
		if err := tr.Put(ctx, key(1000+i), value(i, 512)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Do(ctx, "CLIENT", "PAUSE", "60000", "WRITE"); err != nil {
		t.Fatal(err)
	}
	unpaused := false
	unpause := func() {
		if !unpaused {
			unpaused = true
			if _, err := s.Do(ctx, "CLIENT", "UNPAUSE"); err != nil {
				t.Error(err)
			}
		}
	}
	defer unpause()
	put := make(chan error, 1)
	go func() { put <- tr.Put(ctx, key(2), value(2, 1<<20)) }()
	// Wait until the server holds the SET.
	for deadline := time.Now().Add(10 * time.Second); ; {
		list, err := s.Do(ctx, "CLIENT", "LIST")
		if err != nil {
			t.Fatal(err)
		}
		if heldSet(list) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the SET never reached the server: %s", list)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// valkey-go picks one of a client's connections at random per call:
	// many lookups, so that one sharing the held SET's connection would
	// show (each has its own generous deadline).
	for i := range 32 {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := tr.Has(lctx, append(present, key(3)))
		cancel()
		if n != len(present) || err != nil {
			t.Fatalf("Has %d while a SET is held: %d, %v; want %d (queued behind the write?)", i, n, err, len(present))
		}
	}
	unpause()
	if err := <-put; err != nil {
		t.Fatal(err)
	}
	if got, err := tr.Get(ctx, key(2)); err != nil || !bytes.Equal(got, value(2, 1<<20)) {
		t.Fatalf("Get after the held SET: %d bytes, %v", len(got), err)
	}
}

// heldSet tells whether CLIENT LIST shows a client blocked (flags=b) on a SET.
func heldSet(list string) bool {
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " flags=b ") && strings.Contains(line, " cmd=set ") {
			return true
		}
	}
	return false
}

// existsCalls is how many EXISTS the server has run since its stats reset.
func existsCalls(t *testing.T, s *redisserver.Server) int {
	t.Helper()
	info, err := s.Do(context.Background(), "INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_exists:calls="); ok {
			n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// TestHasRemembersAbsentBriefly: repeated lookups of a prefix the server
// lacks are answered from memory for a moment instead of an EXISTS each;
// our own write is seen at once, another host's write shortly after.
func TestHasRemembersAbsentBriefly(t *testing.T) {
	tr, s := startTier(t)
	ctx := context.Background()
	if err := tr.Put(ctx, "present", value(1, 100)); err != nil {
		t.Fatal(err)
	}
	if n, err := tr.Has(ctx, []string{"present", "ours", "x"}); n != 1 || err != nil {
		t.Fatalf("Has = %d, %v; want 1", n, err)
	}
	if _, err := s.Do(ctx, "CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	const asks = 200
	for range asks {
		if n, err := tr.Has(ctx, []string{"present", "ours", "x"}); n != 1 || err != nil {
			t.Fatalf("Has = %d, %v; want 1", n, err)
		}
	}
	// Each Has asks for "present" (not remembered); "ours" is asked about
	// again only once its absent answer is older than absentFor.
	if got := existsCalls(t, s); got >= 2*asks-asks/2 {
		t.Fatalf("%d EXISTS for %d lookups: absent answers not remembered", got, asks)
	}
	if err := tr.Put(ctx, "ours", value(2, 100)); err != nil {
		t.Fatal(err)
	}
	if n, err := tr.Has(ctx, []string{"present", "ours", "x"}); n != 2 || err != nil {
		t.Fatalf("Has right after our own write = %d, %v; want 2", n, err)
	}
	if n, _ := tr.Has(ctx, []string{"theirs"}); n != 0 {
		t.Fatalf("Has(theirs) = %d before it was written", n)
	}
	if _, err := s.Do(ctx, "SET", DefaultKeyPrefix+"theirs", "v"); err != nil { // another host writes it
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if n, _ := tr.Has(ctx, []string{"theirs"}); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("another host's write never became visible")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKnownAbsentFollowsAbsentAnswers: a key is known absent only after the
// server said so (and until our own write of it).
func TestKnownAbsentFollowsAbsentAnswers(t *testing.T) {
	tr, _ := startTier(t)
	ctx := context.Background()
	if tr.KnownAbsent("k") {
		t.Fatal("known absent before the server was asked")
	}
	if n, err := tr.Has(ctx, []string{"k"}); n != 0 || err != nil {
		t.Fatalf("Has = %d, %v", n, err)
	}
	if !tr.KnownAbsent("k") {
		// The answer is trusted for absentFor only: a slow machine may
		// have passed it; ask again right away.
		if n, _ := tr.Has(ctx, []string{"k"}); n != 0 || !tr.KnownAbsent("k") {
			t.Fatal("the server's absent answer is not remembered")
		}
	}
	if err := tr.Put(ctx, "k", value(1, 10)); err != nil {
		t.Fatal(err)
	}
	if tr.KnownAbsent("k") {
		t.Fatal("known absent right after our own write")
	}
}
