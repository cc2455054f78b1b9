package resp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"kvdock/core/testkit/redisserver"
	"kvdock/core/tierstate"
	"kvdock/transfer/tier"
)

// A streamed SET goes out a piece per pace, and the value is not visible
// under its key until the whole of it (its last byte) has arrived.
func TestPutPartsPacedAndNeverVisibleInPart(t *testing.T) {
	tr, s := startTier(t)
	ctx := context.Background()
	v := value(7, 3*streamPiece+12345)
	k := key(7)
	var paces int
	var seen []string
	err := tr.PutParts(ctx, k, v[:40], v[40:], func() bool {
		// Every byte but the last is on the wire: still not stored.
		n, err := s.Do(ctx, "EXISTS", tr.serverKey(k))
		seen = append(seen, "valid:"+n+errString(err))
		return true
	}, func() {
		paces++
		n, err := s.Do(ctx, "EXISTS", tr.serverKey(k))
		seen = append(seen, n+errString(err))
	})
	if err != nil {
		t.Fatal(err)
	}
	if paces != 4 {
		t.Fatalf("%d paces for %d payload bytes, want one per %d-byte piece (4)", paces, len(v)-40, streamPiece)
	}
	for _, x := range seen {
		if x != "0" && x != "valid:0" {
			t.Fatalf("the key was visible (or the check failed) before the SET ended: %q", seen)
		}
	}
	got, err := tr.Get(ctx, k)
	if err != nil || !bytes.Equal(got, v) {
		t.Fatalf("Get after PutParts: %d bytes, %v", len(got), err)
	}
	if st := tr.Stats(); st.WriteBytes != uint64(len(v)) || st.Objects != 1 {
		t.Fatalf("Stats = %+v", st)
	}
}

func errString(err error) string {
	if err != nil {
		return " " + err.Error()
	}
	return ""
}

// The source's hold ended during the write (valid false): nothing is
// stored, the error says so (the writer counts it as skipped, not failed),
// the tier stays up, and the next write goes through.
func TestPutPartsSourceReleasedStoresNothing(t *testing.T) {
	tr, s := startTier(t)
	ctx := context.Background()
	v := value(8, 2*streamPiece)
	k := key(8)
	// An old value under the key must survive an abandoned overwrite.
	if err := tr.Put(ctx, k, value(9, 100)); err != nil {
		t.Fatal(err)
	}
	err := tr.PutParts(ctx, k, v[:10], v[10:], func() bool { return false }, nil)
	if !errors.Is(err, tier.ErrSourceChanged) {
		t.Fatalf("PutParts with the source released: %v, want ErrSourceChanged", err)
	}
	if got, err := s.Do(ctx, "GET", tr.serverKey(k)); err != nil || got != string(value(9, 100)) {
		t.Fatalf("after an abandoned SET the key holds %d bytes (%v), want the old 100", len(got), err)
	}
	if st := tr.Stats(); st.State != tierstate.Up {
		t.Fatalf("state after an abandoned SET: %+v", st)
	}
	if err := putEither(ctx, tr, 1, k, v); err != nil {
		t.Fatalf("the next write: %v", err)
	}
	if got, err := tr.Get(ctx, k); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("Get: %d bytes, %v", len(got), err)
	}
}

// A writer whose context ends mid-value (the write timeout, a stop) leaves
// nothing stored and the tier up: slow is not down.
func TestPutPartsGivenUpMidway(t *testing.T) {
	tr, s := startTier(t)
	ctx, cancel := context.WithCancel(context.Background())
	v := value(10, 4*streamPiece)
	k := key(10)
	var paces int
	err := tr.PutParts(ctx, k, v[:10], v[10:], func() bool { return true }, func() {
		if paces++; paces == 2 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("PutParts cancelled midway: %v", err)
	}
	bg := context.Background()
	if n, err := s.Do(bg, "EXISTS", tr.serverKey(k)); err != nil || n != "0" {
		t.Fatalf("EXISTS after a cancelled SET = %s, %v", n, err)
	}
	if st := tr.Stats(); st.State != tierstate.Up || st.Objects != 0 {
		t.Fatalf("after a cancelled SET: %+v", st)
	}
}

// Connections the server dropped while idle (a client kill, its timeout)
// cost a redial, not a failed write or a tier marked down.
func TestPutPartsRedialsDroppedIdleConnection(t *testing.T) {
	tr, s := startTier(t)
	ctx := context.Background()
	for i := range 3 {
		v := value(20+i, streamPiece+1)
		if err := putEither(ctx, tr, 1, key(20+i), v); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		if got, err := tr.Get(ctx, key(20+i)); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("Get %d: %d bytes, %v", i, len(got), err)
		}
		// Drop the tier's own connections (the streamed SETs' and the
		// value reads'): they speak RESP2, the library RESP3.
		list, err := s.Do(ctx, "CLIENT", "LIST")
		if err != nil {
			t.Fatal(err)
		}
		killed := 0
		for _, line := range strings.Split(list, "\n") {
			if !strings.Contains(line, " resp=2") || strings.Contains(line, " cmd=client") {
				continue
			}
			for _, f := range strings.Fields(line) {
				if addr, ok := strings.CutPrefix(f, "addr="); ok {
					if _, err := s.Do(ctx, "CLIENT", "KILL", "ADDR", addr); err != nil {
						t.Fatal(err)
					}
					killed++
				}
			}
		}
		if killed == 0 {
			t.Fatalf("no streamed SET connection in CLIENT LIST:\n%s", list)
		}
		if st := tr.Stats(); st.State != tierstate.Up {
			t.Fatalf("after write %d: %+v", i, st)
		}
	}
}

// Hostile values of the pieces: empty head, empty payload, a payload of
// exactly one piece, many writers at once on few connections.
func TestPutPartsShapesAndConcurrency(t *testing.T) {
	s := redisserver.Start(t, redisserver.Options{})
	cfg := standaloneCfg(s)
	cfg.NumWorkers = 2
	tr, _ := open(t, cfg)
	ctx := context.Background()
	shapes := [][2]int{{0, 5}, {5, 0}, {0, 0}, {3, streamPiece}, {1, streamPiece - 1}}
	for i, sh := range shapes {
		v := value(40+i, sh[0]+sh[1])
		if err := tr.PutParts(ctx, key(40+i), v[:sh[0]], v[sh[0]:], nil, nil); err != nil {
			t.Fatalf("shape %v: %v", sh, err)
		}
		if got, err := tr.Get(ctx, key(40+i)); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("shape %v: Get %d bytes, %v", sh, len(got), err)
		}
	}
	var failed atomic.Int32
	done := make(chan struct{})
	for w := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			for j := range 4 {
				i := 100 + w*10 + j
				v := value(i, 300_000+i)
				if err := tr.PutParts(ctx, key(i), v[:16], v[16:], func() bool { return true }, nil); err != nil {
					failed.Add(1)
					t.Errorf("writer %d: %v", w, err)
				}
			}
		}()
	}
	for range 8 {
		<-done
	}
	if failed.Load() > 0 {
		return
	}
	for w := range 8 {
		for j := range 4 {
			i := 100 + w*10 + j
			if got, err := tr.Get(ctx, key(i)); err != nil || !bytes.Equal(got, value(i, 300_000+i)) {
				t.Fatalf("value %d: %d bytes, %v", i, len(got), err)
			}
		}
	}
}

// keySlot agrees with the cluster's own CLUSTER KEYSLOT, hash tags included.
func TestKeySlotMatchesServer(t *testing.T) {
	if got := keySlot("123456789"); got != 0x31C3 {
		t.Fatalf("keySlot(123456789) = %d, want %d (CRC-16/XMODEM check value)", got, 0x31C3)
	}
	c := redisserver.StartCluster(t, 3)
	ctx := context.Background()
	keys := []string{"", "a", "foo", "{user1000}.following", "{}x", "a{}b", "x{y}z{w}", "{{a}}", "kvdock:" + key(3)}
	for i := range 50 {
		keys = append(keys, fmt.Sprintf("kv:%064x@m@%08x", i*7919, i))
	}
	for _, k := range keys {
		want, err := c.Nodes[0].Do(ctx, "CLUSTER", "KEYSLOT", k)
		if err != nil {
			t.Fatal(err)
		}
		if got := keySlot(k); strconv.Itoa(got) != want {
			t.Fatalf("keySlot(%q) = %d, server says %s", k, got, want)
		}
	}
}

// A cluster whose slots moved (our slot map is stale): the write that
// meets MOVED fails (counted by the writer, not marking the tier down or
// degraded), the map is fetched again, and the next write lands on the
// slot's owner.
func TestPutPartsStaleSlotMapRecovers(t *testing.T) {
	c := redisserver.StartCluster(t, 3)
	cfg := RESPConfig{Cluster: true, StartupNodes: c.Addrs()[:1], NumWorkers: 2, CapacityBytes: 1 << 30, KeyPrefix: "kv:"}
	tr, _ := open(t, cfg)
	ctx := context.Background()
	// A key that node 0 does not serve.
	k, owner := "", ""
	for i := range 1000 {
		k = key(500 + i)
		addr, err := tr.streams.route(ctx, tr.serverKey(k))
		if err != nil {
			t.Fatal(err)
		}
		if addr != c.Addrs()[0] {
			owner = addr
			break
		}
	}
	if owner == "" {
		t.Fatal("every key routed to node 0")
	}
	// Pretend every slot is node 0's.
	tr.streams.mu.Lock()
	tr.streams.slots = &slotMap{ranges: []slotRange{{0, clusterSlots - 1, c.Addrs()[0]}}}
	tr.streams.mu.Unlock()
	v := value(9, streamPiece/2)
	err := tr.PutParts(ctx, k, v[:8], v[8:], func() bool { return true }, nil)
	if err == nil || !strings.Contains(err.Error(), "MOVED") {
		t.Fatalf("write through a stale slot map: %v, want MOVED", err)
	}
	if st := tr.Stats(); st.State != tierstate.Up {
		t.Fatalf("after MOVED: %+v", st)
	}
	if err := tr.PutParts(ctx, k, v[:8], v[8:], func() bool { return true }, nil); err != nil {
		t.Fatalf("the next write: %v", err)
	}
	if got, err := tr.Get(ctx, k); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("Get: %d bytes, %v", len(got), err)
	}
}

// A value past the server's default bulk limit is refused before anything
// is sent (the server would close the connection on it, which reads as the
// tier failing): an error, the tier up, the key absent.
func TestPutPartsRefusesValuePastBulkLimit(t *testing.T) {
	tr, s := startTier(t)
	ctx := context.Background()
	huge := make([]byte, maxValueBytes) // fresh pages: not touched
	err := tr.PutParts(ctx, key(1), []byte{1}, huge, func() bool { return true }, nil)
	if err == nil || !strings.Contains(err.Error(), "bulk limit") {
		t.Fatalf("PutParts of %d bytes: %v", maxValueBytes+1, err)
	}
	if st := tr.Stats(); st.State != tierstate.Up || st.Objects != 0 {
		t.Fatalf("after a refused value: %+v", st)
	}
	if n, err := s.Do(ctx, "EXISTS", tr.serverKey(key(1))); err != nil || n != "0" {
		t.Fatalf("EXISTS = %s, %v", n, err)
	}
}
