package resp

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"kvdock/core/testkit/logbuf"
	"kvdock/core/testkit/redisserver"
)

// held is what the server holds under prefix besides the share lists: the
// values (by the tier's key) and the bytes MEMORY USAGE gives for them.
type held struct {
	keys  map[string]int64
	bytes int64
}

func serverHolds(t *testing.T, s *redisserver.Server, prefix string) held {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	all, err := s.Holds(ctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	h := held{keys: map[string]int64{}}
	for k, n := range all {
		name, ok := strings.CutPrefix(strings.TrimPrefix(k, "{}"), prefix)
		if !ok || strings.HasPrefix(name, "index:") {
			continue
		}
		h.keys[name] = n
		h.bytes += n
	}
	return h
}

// openLoaded opens a tier and waits until it has adopted its share.
func openLoaded(t *testing.T, cfg RESPConfig) (*Tier, *logbuf.Buffer) {
	t.Helper()
	tr, lb := open(t, cfg)
	if err := lb.Wait("adopted this host's values", 10*time.Second); err != nil {
		t.Fatalf("the share was not loaded: %v\n%s", err, lb.String())
	}
	return tr, lb
}

// store puts n values of size bytes under keys from..from+n-1.
func store(t *testing.T, tr *Tier, from, n, size int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		if err := putEither(context.Background(), tr, i, key(i), value(i, size)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
}

// TestCapacityHeldAcrossRestarts: values stored past max_capacity_gb, the
// tier reopened (a restart), more stored: the server holds no more than
// the capacity (MEMORY USAGE, the allocator's rounding included), the
// reopened tier counts the values of the earlier run, and the values that
// went are the oldest.
func TestCapacityHeldAcrossRestarts(t *testing.T) {
	s := redisserver.Start(t, redisserver.Options{})
	cfg := standaloneCfg(s)
	cfg.CapacityBytes = 2 << 20
	cfg.Instance = "hostA"
	const size = 200 << 10 // 224 KiB on the server: 9 fit in 2 MiB
	tr, _ := openLoaded(t, cfg)
	store(t, tr, 0, 16, size)
	first := serverHolds(t, s, cfg.KeyPrefix)
	if first.bytes > cfg.CapacityBytes {
		t.Fatalf("first run: the server holds %d bytes in %d values, capacity %d", first.bytes, len(first.keys), cfg.CapacityBytes)
	}
	if st := tr.Stats(); st.UsedBytes != first.bytes || st.Objects != int64(len(first.keys)) {
		t.Fatalf("first run: the tier counts %d bytes in %d values, the server holds %d in %d", st.UsedBytes, st.Objects, first.bytes, len(first.keys))
	}
	_ = tr.Close()

	tr, lb := openLoaded(t, cfg)
	if st := tr.Stats(); st.UsedBytes != first.bytes || st.Objects != int64(len(first.keys)) {
		t.Fatalf("after the restart the tier counts %d bytes in %d values, the server holds %d in %d\n%s",
			st.UsedBytes, st.Objects, first.bytes, len(first.keys), lb.String())
	}
	store(t, tr, 100, 16, size)
	second := serverHolds(t, s, cfg.KeyPrefix)
	t.Logf("capacity %d: first run %d values, %d bytes; after a restart and 16 more: %d values, %d bytes",
		cfg.CapacityBytes, len(first.keys), first.bytes, len(second.keys), second.bytes)
	if second.bytes > cfg.CapacityBytes {
		t.Fatalf("after a restart: the server holds %d bytes in %d values, capacity %d", second.bytes, len(second.keys), cfg.CapacityBytes)
	}
	if st := tr.Stats(); st.UsedBytes != second.bytes || st.Objects != int64(len(second.keys)) {
		t.Fatalf("after a restart: the tier counts %d bytes in %d values, the server holds %d in %d", st.UsedBytes, st.Objects, second.bytes, len(second.keys))
	}
	for i := 100 + 16 - len(second.keys); i < 116; i++ {
		if _, ok := second.keys[key(i)]; !ok {
			t.Fatalf("value %d, among the newest, is gone; the server holds %v", i, second.keys)
		}
	}
}

// TestSharedServerKeepsEachHostsShare: two hosts with the same prefix on
// one server each keep their own values within their own capacity, also
// across a restart of one of them, which neither counts nor evicts the
// other's values.
func TestSharedServerKeepsEachHostsShare(t *testing.T) {
	s := redisserver.Start(t, redisserver.Options{})
	cfgA, cfgB := standaloneCfg(s), standaloneCfg(s)
	cfgA.CapacityBytes, cfgB.CapacityBytes = 2<<20, 2<<20
	cfgA.Instance, cfgB.Instance = "hostA", "hostB"
	const size = 200 << 10
	a, _ := openLoaded(t, cfgA)
	b, _ := openLoaded(t, cfgB)
	store(t, a, 0, 16, size)
	store(t, b, 1000, 16, size)
	share := func(h held, from int) (n int, bytes int64) {
		for i := from; i < from+1000; i++ {
			if sz, ok := h.keys[key(i)]; ok {
				n++
				bytes += sz
			}
		}
		return n, bytes
	}
	before := serverHolds(t, s, cfgA.KeyPrefix)
	nA, bytesA := share(before, 0)
	nB, bytesB := share(before, 1000)
	if bytesA > cfgA.CapacityBytes || bytesB > cfgB.CapacityBytes || nA == 0 || nB == 0 {
		t.Fatalf("host A holds %d values (%d bytes), host B %d (%d bytes), capacity %d each", nA, bytesA, nB, bytesB, cfgA.CapacityBytes)
	}
	_ = a.Close()
	a, _ = openLoaded(t, cfgA)
	if st := a.Stats(); st.Objects != int64(nA) || st.UsedBytes != bytesA {
		t.Fatalf("host A after its restart counts %d values (%d bytes), it holds %d (%d bytes)", st.Objects, st.UsedBytes, nA, bytesA)
	}
	store(t, a, 200, 16, size)
	after := serverHolds(t, s, cfgA.KeyPrefix)
	nA2, bytesA2 := share(after, 0)
	nB2, bytesB2 := share(after, 1000)
	t.Logf("host A %d values (%d bytes) → %d (%d bytes) after its restart and 16 more; host B %d (%d bytes) → %d (%d bytes)",
		nA, bytesA, nA2, bytesA2, nB, bytesB, nB2, bytesB2)
	if bytesA2 > cfgA.CapacityBytes {
		t.Fatalf("host A holds %d bytes after its restart, capacity %d", bytesA2, cfgA.CapacityBytes)
	}
	if nB2 != nB || bytesB2 != bytesB {
		t.Fatalf("host A's restart changed host B's share: %d values (%d bytes), was %d (%d bytes)", nB2, bytesB2, nB, bytesB)
	}
}

// TestShareRefusesHostileFields: fields of the share no key of ours can be
// (too long, a time that is no number) and fields of keys gone are dropped
// from it at start and count nothing.
func TestShareRefusesHostileFields(t *testing.T) {
	s := redisserver.Start(t, redisserver.Options{})
	cfg := standaloneCfg(s)
	cfg.Instance = "hostA"
	ctx := context.Background()
	shareKey := cfg.KeyPrefix + "index:hostA"
	now := fmt.Sprint(time.Now().UnixMilli())
	if _, err := s.Do(ctx, "SET", "{}"+cfg.KeyPrefix+key(1), "x"); err != nil {
		t.Fatal(err)
	}
	for _, fv := range [][2]string{
		{key(1), now},                    // ours, present
		{key(2), now},                    // ours, gone
		{key(3), "soon"},                 // no time
		{strings.Repeat("k", 4096), now}, // longer than any key of ours
	} {
		if _, err := s.Do(ctx, "HSET", shareKey, fv[0], fv[1]); err != nil {
			t.Fatal(err)
		}
	}
	tr, lb := openLoaded(t, cfg)
	if st := tr.Stats(); st.Objects != 1 || st.UsedBytes <= 0 {
		t.Fatalf("adopted %d values (%d bytes), want the one present\n%s", st.Objects, st.UsedBytes, lb.String())
	}
	if n, err := s.Do(ctx, "HLEN", shareKey); err != nil || n != "1" {
		t.Fatalf("the share holds %s fields (%v), want the one present", n, err)
	}
}

// TestShareValuesTakenOnAfterARestart: values this host wrote, the tier
// reopened (a restart), the keys a restart carried taken on before the
// share's load ends: each still on the server is told held once the load
// adopts it, one taken on after the load at once, a key not on the server
// never, and a value taken on is told gone when deleted.
func TestShareValuesTakenOnAfterARestart(t *testing.T) {
	s := redisserver.Start(t, redisserver.Options{})
	cfg := standaloneCfg(s)
	cfg.Instance = "hostA"
	tr, _ := openLoaded(t, cfg)
	store(t, tr, 0, 3, 1000)
	_ = tr.Close()

	tr, lb := open(t, cfg)
	var mu sync.Mutex
	var got []string
	f := func(k string, present bool) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprint(k == key(0), k == key(1), k == key(2), present))
	}
	tr.NotifyContents(f)
	tr.Adopt(key(0))
	tr.Adopt(key(1))
	tr.Adopt(key(99)) // not on the server
	if err := lb.Wait("adopted this host's values", 10*time.Second); err != nil {
		t.Fatalf("the share was not loaded: %v\n%s", err, lb.String())
	}
	if !tr.Adopt(key(2)) || tr.Adopt(key(2)) || tr.Adopt(key(98)) {
		t.Fatal("after the load: an adopted key refused, taken on twice, or an absent key taken on")
	}
	if err := tr.Delete(context.Background(), key(0)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(got[:2]) // the load adopts in its own order
	want := []string{"false true false true", "true false false true", "false false true true", "true false false false"}
	if !slices.Equal(got, want) {
		t.Fatalf("told %q, want %q", got, want)
	}
}
