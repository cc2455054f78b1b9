package nongpu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"kvdock/core/l1"
	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/core/rpc/client"
	"kvdock/core/testkit/profiles"
	"kvdock/core/workers"
)

// victimState is what a rejected commit must leave alone.
type victimState struct {
	mode                  workers.Mode
	reason                string
	stores, storeFailures int64
	bytesIn               int64
	fallbacks             int64
	pendingWrites         int
}

func (e *env) victim(id int64) victimState {
	e.t.Helper()
	for _, c := range e.mod.Contexts() {
		if c.InstanceID == id {
			s := e.mod.Stats()
			return victimState{c.Mode, c.Reason, c.Stores, c.StoreFailures, c.BytesIn, s.Fallbacks, s.PendingWrites}
		}
	}
	e.t.Fatalf("instance %d not registered", id)
	return victimState{}
}

// A COMMIT_STORE carrying the victim's instance id but bytes that do not
// prove a pickle fallback (bad key, garbage, wrong layout, wrong tensor
// count) changes nothing: not the mode, not the pending SHM reservation, not
// the instance's counters.
func TestRejectedCommitChangesNothing(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	toks := tokens(2*testChunk, 300)
	pendingKey := key(toks, 0, testChunk)
	ps, err := e.mod.PrepareStore(pendingKey, 1)
	if err != nil || len(ps.Slots) != 1 {
		t.Fatalf("victim prepare = %+v, %v", ps, err)
	}
	e.writeSlots(ps.Slots[:1], 42)
	before := e.victim(1)
	if before.mode != workers.ModeSHM || before.pendingWrites != 1 {
		t.Fatalf("victim before the attack: %+v", before)
	}

	otherModel := pendingKey
	otherModel.ModelName = "anything"
	noWorker := pendingKey
	noWorker.WorkerID = nil
	badWorker := pendingKey
	badWorker.WorkerID = intptr(7)
	twoChunks := key(toks, 0, 2*testChunk)
	wrongShape := tensorOf(1)
	wrongShape.Shape = []int{2, 2, 4, testChunk}
	wrongDtype := tensorOf(1)
	wrongDtype.Dtype = "bfloat16"
	short := tensorOf(1)
	short.Data = short.Data[:chunkBytes-2]
	short.Shape = []int{2, 2, testChunk, 4}
	attacks := []struct {
		name string
		k    protocol.Key
		data []byte
	}{
		{"other model, 1 garbage byte", otherModel, []byte{0x80}},
		{"no worker id", noWorker, []byte{0x80}},
		{"worker outside world", badWorker, pickled(t, tensorOf(1))},
		{"right key, 1 garbage byte", pendingKey, []byte{0x80}},
		{"right key, truncated pickle", pendingKey, pickled(t, tensorOf(1))[:100]},
		{"right key, wrong shape", pendingKey, pickled(t, wrongShape)},
		{"right key, wrong dtype", pendingKey, pickled(t, wrongDtype)},
		{"right key, two tensors for one chunk", pendingKey, pickled(t, tensorOf(1), tensorOf(2))},
		{"right key, no tensor", pendingKey, pickled(t)},
		{"two chunks, one tensor", twoChunks, pickled(t, tensorOf(1))},
		{"two chunks, second wrong", twoChunks, pickled(t, tensorOf(1), wrongDtype)},
		{"empty range", key(toks, testChunk, testChunk), pickled(t)},
	}
	for _, a := range attacks {
		ok, _ := e.mod.CommitStore(a.k, 1, a.data)
		if ok {
			t.Errorf("%s: answered true", a.name)
		}
		if after := e.victim(1); after != before {
			t.Errorf("%s: victim changed from %+v to %+v", a.name, before, after)
		}
		if n := e.cached(twoChunks); n != 0 {
			t.Errorf("%s: %d chunks stored", a.name, n)
		}
	}
	if n := len(e.eventsOf(workers.EventFallback)); n != 0 {
		t.Fatalf("%d fallback events", n)
	}
	unproven := false
	for _, ev := range e.eventsOf(workers.EventError) {
		unproven = unproven || strings.Contains(ev.Message, "mode unchanged")
	}
	if !unproven {
		t.Fatal("no event tells the operator why the pickled chunks were refused")
	}
	// The victim's own commit still publishes what it wrote, and it keeps
	// getting slots.
	if ok, err := e.mod.CommitStore(pendingKey, 1, nil); !ok || err != nil {
		t.Fatalf("victim commit = %v, %v", ok, err)
	}
	ks := e.lookupLock(pendingKey)
	ref, held := e.pool.HoldRead(ks[0])
	if !held {
		t.Fatal("victim's published chunk is not readable")
	}
	want := make([]byte, chunkBytes)
	fill(want, 42)
	if got := e.slotBytes(protocol.Slot{Offset: ref.Offset, Length: ref.Length}); string(got) != string(want) {
		t.Fatal("victim's chunk holds other bytes")
	}
	e.pool.ReleaseRead([]l1.ReadRef{ref})
	next, err := e.mod.PrepareStore(key(tokens(testChunk, 900), 0, testChunk), 1)
	if err != nil || !next.Shm || len(next.Slots) != 1 {
		t.Fatalf("victim's next prepare = %+v, %v; want one slot", next, err)
	}
}

// An instance switched to PICKLE that then commits an SHM reservation made
// before the switch proves SHM works: it goes back to SHM, with an event.
func TestSHMCommitSwitchesBack(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	ka := key(tokens(testChunk, 10), 0, testChunk)
	kb := key(tokens(testChunk, 5000), 0, testChunk)
	ps, _ := e.mod.PrepareStore(ka, 1)
	if len(ps.Slots) != 1 {
		t.Fatalf("prepare %+v", ps)
	}
	e.writeSlots(ps.Slots[:1], 7)
	// A valid pickle commit of another key switches the instance to PICKLE
	// (it is indistinguishable from a worker that fell back)…
	if ok, err := e.mod.CommitStore(kb, 1, pickled(t, tensorOf(3))); !ok || err != nil {
		t.Fatalf("pickle commit = %v, %v", ok, err)
	}
	if c := e.mod.Contexts()[0]; c.Mode != workers.ModePickle {
		t.Fatalf("mode %s after a valid pickle commit, want PICKLE", c.Mode)
	}
	if r, _ := e.mod.PrepareStore(key(tokens(testChunk, 7000), 0, testChunk), 1); r.Shm {
		t.Fatal("PICKLE instance got slots")
	}
	// …and the commit of the earlier SHM reservation switches it back.
	if ok, err := e.mod.CommitStore(ka, 1, nil); !ok || err != nil {
		t.Fatalf("SHM commit = %v, %v", ok, err)
	}
	c := e.mod.Contexts()[0]
	if c.Mode != workers.ModeSHM || !strings.Contains(c.Reason, "SHM write") {
		t.Fatalf("after the SHM commit: %s %q, want SHM with the reason", c.Mode, c.Reason)
	}
	if evs := e.eventsOf(workers.EventSHMBack); len(evs) != 1 || !strings.Contains(evs[0].Message, "instance 1") {
		t.Fatalf("switch-back events %+v", evs)
	}
	if e.cached(ka) != 1 || e.cached(kb) != 1 {
		t.Fatal("chunks not stored")
	}
	if r, _ := e.mod.PrepareStore(key(tokens(testChunk, 8000), 0, testChunk), 1); !r.Shm || len(r.Slots) != 1 {
		t.Fatalf("after switching back the prepare = %+v, want one slot", r)
	}
}

// serveWire serves the module's handlers over a real ZMQ socket (profile
// nongpu-v1) and returns a dial function for clients.
func serveWire(t *testing.T, m *Module) func() *client.Client {
	t.Helper()
	_, dial := serveWireAt(t, m)
	return dial
}

// serveWireAt is serveWire that also gives the server's endpoint.
func serveWireAt(t *testing.T, m *Module) (string, func() *client.Client) {
	t.Helper()
	prof := profiles.Load(t, "nongpu-v1")
	srv, err := rpc.New(rpc.Options{Host: "127.0.0.1", Port: 0, Profile: prof,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for name, h := range m.Handlers() {
		srv.Handle(name, h)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	select {
	case <-srv.Bound():
	case err := <-done:
		cancel()
		t.Fatalf("Serve: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return srv.Endpoint(), func() *client.Client {
		c, err := client.Dial(srv.Endpoint(), prof, client.Options{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
}

type wireStoreReply struct {
	Context struct {
		Slots        []map[string]any `msgpack:"slots"`
		ChunkIndices []int            `msgpack:"chunk_indices"`
	} `msgpack:"context"`
}

// Over the wire: an attacker sends COMMIT_STORE with the victim's instance
// id (as listed by /status), any model name and one garbage byte. The victim
// stays SHM and its next PREPARE_STORE gets slots.
func TestWireGarbageCommitKeepsVictimSHM(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	dial := serveWire(t, e.mod)
	victim, attacker := dial(), dial()
	ctx := context.Background()

	r, err := victim.Call(ctx, protocol.RegisterKVCacheNonGPUContext, payload(1))
	var reg struct {
		ShmName  string `msgpack:"shm_name"`
		PoolSize int64  `msgpack:"pool_size"`
	}
	if err != nil || r.Decode(&reg) != nil || reg.ShmName == "" {
		t.Fatalf("register = %+v, %v", reg, err)
	}
	for _, model := range []string{"x", "m"} {
		k := key(tokens(testChunk, 1), 0, testChunk)
		k.ModelName = model
		// The server answers nothing to a failed request (no error frames in
		// this profile): the call ends on its own timeout, which orders nothing.
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		r, err := attacker.Call(short, protocol.CommitStore, k, int64(1), []byte{0x80})
		cancel()
		if err == nil {
			var ok bool
			if r.Decode(&ok) == nil && ok {
				t.Fatalf("garbage commit (model %q) answered true", model)
			}
		} else if !errors.Is(err, client.ErrTimeout) {
			t.Fatalf("garbage commit: %v", err)
		}
		// The attacker's next ordered request is answered after its garbage
		// commit was handled (per-peer FIFO): a barrier, not a sleep.
		r, err = attacker.Call(ctx, protocol.CommitRetrieve, key(tokens(testChunk, 1), 0, testChunk), int64(1))
		var ok bool
		if err != nil || r.Decode(&ok) != nil || !ok {
			t.Fatalf("barrier COMMIT_RETRIEVE = %v, %v", ok, err)
		}
	}
	if c := e.mod.Contexts()[0]; c.Mode != workers.ModeSHM {
		t.Fatalf("victim switched to %s (%s)", c.Mode, c.Reason)
	}
	r, err = victim.Call(ctx, protocol.PrepareStore, key(tokens(testChunk, 1), 0, testChunk), int64(1))
	var ps wireStoreReply
	if err != nil || r.Decode(&ps) != nil || len(ps.Context.Slots) != 1 {
		t.Fatalf("victim's PREPARE_STORE = %+v, %v; want one slot", ps, err)
	}
	r, err = victim.Call(ctx, protocol.CommitStore, key(tokens(testChunk, 1), 0, testChunk), int64(1), []byte{})
	var ok bool
	if err != nil || r.Decode(&ok) != nil || !ok {
		t.Fatalf("victim's COMMIT_STORE = %v, %v", ok, err)
	}
}

// server.max_instances refuses new ids beyond it with a clear error and an
// event; re-registering a known id is not a new instance; an unregister
// makes room; the limit is live.
func TestMaxInstances(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.mod.SetMaxInstances(3)
	for id := int64(1); id <= 3; id++ {
		e.register(id)
	}
	_, err := e.mod.RegisterThrough(payload(4), nil, "")
	if !errors.Is(err, ErrTooManyInstances) || !strings.Contains(err.Error(), "--max-instances") || !strings.Contains(err.Error(), "3") {
		t.Fatalf("4th registration: %v", err)
	}
	if evs := e.eventsOf(workers.EventError); len(evs) == 0 || !strings.Contains(evs[len(evs)-1].Message, "max_instances") {
		t.Fatalf("no event for the refusal: %+v", evs)
	}
	if _, err := e.mod.RegisterThrough(payload(2), nil, ""); err != nil {
		t.Fatalf("re-registering a known id at the limit: %v", err)
	}
	e.mod.Unregister(3)
	e.register(4)
	e.mod.SetMaxInstances(1) // lower than the count: nobody is dropped…
	if n := len(e.mod.Contexts()); n != 3 {
		t.Fatalf("%d instances after lowering the limit, want 3 kept", n)
	}
	if _, err := e.mod.RegisterThrough(payload(5), nil, ""); !errors.Is(err, ErrTooManyInstances) { // …but nobody new gets in
		t.Fatalf("registration above a lowered limit: %v", err)
	}
	if e.layouts.Has("m", 1) != true {
		t.Fatal("layout of the kept instances dropped")
	}
}

// 200k registrations of new ids: the default limit holds them at
// DefaultMaxInstances, fast, and /status stays bounded.
func TestRegistrationFloodBounded(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	name := strings.Repeat("n", MaxModelNameBytes-8)
	start := time.Now()
	accepted := 0
	for id := int64(0); id < 200_000; id++ {
		p := payload(id)
		p.ModelName = fmt.Sprintf("%s%08d", name, id) // every name its own layout entry
		if _, err := e.mod.RegisterThrough(p, nil, ""); err == nil {
			accepted++
		} else if !errors.Is(err, ErrTooManyInstances) {
			t.Fatalf("registration %d: %v", id, err)
		}
	}
	took := time.Since(start)
	if accepted != DefaultMaxInstances || len(e.mod.Contexts()) != DefaultMaxInstances {
		t.Fatalf("%d registrations accepted, want %d", accepted, DefaultMaxInstances)
	}
	if took > 20*time.Second {
		t.Fatalf("200k registrations took %s", took)
	}
	st, err := json.Marshal(e.mod.Status())
	if err != nil {
		t.Fatal(err)
	}
	if len(st) > 1<<20 {
		t.Fatalf("/status part is %d bytes with %d instances", len(st), DefaultMaxInstances)
	}
	if n := len(e.eventsOf(workers.EventError)); n > 5 {
		t.Fatalf("%d error events for one burst of refusals: not rate-limited", n)
	}
	t.Logf("200k registrations: %s; %d accepted; status %d bytes", took, accepted, len(st))
}

// Peer strings kept by registration are bounded, and errors about huge ones
// stay short.
func TestRegistrationStringsBounded(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	huge := strings.Repeat("M", 16<<20)
	cases := map[string]func(*protocol.RegisterPayload){
		"16 MiB model name": func(p *protocol.RegisterPayload) { p.ModelName = huge },
		"257-byte name":     func(p *protocol.RegisterPayload) { p.ModelName = strings.Repeat("a", MaxModelNameBytes+1) },
		"16 MiB dtype":      func(p *protocol.RegisterPayload) { p.DtypeStr = huge },
		"16 MiB @ name":     func(p *protocol.RegisterPayload) { p.ModelName = "@" + huge },
	}
	for name, mut := range cases {
		p := payload(1)
		mut(&p)
		_, err := e.mod.RegisterThrough(p, nil, "")
		if err == nil {
			t.Errorf("%s: registered", name)
			continue
		}
		if len(err.Error()) > 1024 {
			t.Errorf("%s: %d-byte error", name, len(err.Error()))
		}
	}
	for _, ev := range e.events {
		if len(ev.Message) > 1024 {
			t.Fatalf("%d-byte event", len(ev.Message))
		}
	}
	p := payload(2)
	p.ModelName = strings.Repeat("a", MaxModelNameBytes)
	if _, err := e.mod.RegisterThrough(p, nil, ""); err != nil {
		t.Fatalf("a %d-byte name: %v", MaxModelNameBytes, err)
	}
	// A key for a registered instance naming a huge model: short error.
	k := key(tokens(testChunk, 1), 0, testChunk)
	k.ModelName = huge
	if _, err := e.mod.PrepareStore(k, 2); err == nil || len(err.Error()) > 1024 {
		t.Fatalf("huge key model: error of %d bytes", len(fmt.Sprint(err)))
	}
}

// num_layers 2^30 × hidden 2^24 once registered with chunk bytes 0 at 256
// tokens per chunk; at this test's 16 tokens hidden 2^28 wraps the same way.
func TestRegistrationRefusesOverflowingLayout(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	for _, hidden := range []int{1 << 28, 1 << 24, 1<<31 - 1} {
		p := payload(1)
		p.NumLayers, p.HiddenDimSize = 1<<30, hidden
		_, err := e.mod.RegisterThrough(p, nil, "")
		if err == nil {
			t.Fatalf("hidden %d registered: %+v", hidden, e.mod.Contexts())
		}
		for _, want := range []string{"num_layers", "hidden_dim_size", "1 GiB"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not name %q", err, want)
			}
		}
	}
	if len(e.mod.Contexts()) != 0 || e.layouts.Has("m", 1) {
		t.Fatal("refused layout kept")
	}
}

// world_size (the tp size nongpu keys by) is 1..255, upstream's range, and
// worker ids must fall inside it.
func TestWorldSizeClamped(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	for _, ws := range []int{0, -1, 256, 1<<31 - 1, math.MinInt32} {
		p := payload(1)
		p.WorldSize = ws
		if _, err := e.mod.RegisterThrough(p, nil, ""); err == nil {
			t.Errorf("world_size %d registered", ws)
		}
	}
	p := payload(1)
	p.WorldSize = 255
	if _, err := e.mod.RegisterThrough(p, nil, ""); err != nil {
		t.Fatalf("world_size 255: %v", err)
	}
	k := key(tokens(testChunk, 1), 0, testChunk)
	k.WorldSize = 255
	for _, w := range []int{255, 1 << 30, -1} {
		k.WorkerID = intptr(w)
		if _, err := e.mod.PrepareStore(k, 1); err == nil {
			t.Errorf("worker_id %d of world 255 accepted", w)
		}
	}
	if s := e.mod.Stats(); s.PendingWrites != 0 {
		t.Fatalf("pending writes %d", s.PendingWrites)
	}
}

// The cache salt is part of a transfer's identity (upstream's key equality)
// but a pending entry keeps only its hash.
func TestPendingMatchesSalt(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	k := key(tokens(testChunk, 1), 0, testChunk)
	k.CacheSalt = strings.Repeat("s", 128) // the most keys allows
	if r, err := e.mod.PrepareStore(k, 1); len(r.Slots) != 1 {
		t.Fatalf("prepare %+v, %v", r, err)
	}
	other := k
	other.CacheSalt = k.CacheSalt[:len(k.CacheSalt)-1] + "t"
	if ok, _ := e.mod.CommitStore(other, 1, nil); ok {
		t.Fatal("commit with another salt published the reservation")
	}
	if ok, _ := e.mod.CommitStore(k, 1, nil); !ok {
		t.Fatal("commit with the same salt failed")
	}
}

// Concurrent registrations racing for the last places never pass the limit.
func TestMaxInstancesConcurrent(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.mod.SetMaxInstances(10)
	start := make(chan struct{})
	errs := make(chan error, 64)
	for id := int64(0); id < 64; id++ {
		go func() {
			<-start
			_, err := e.mod.RegisterThrough(payload(id%32), nil, "") // every id twice
			errs <- err
		}()
	}
	close(start)
	refused := 0
	for range 64 {
		if err := <-errs; errors.Is(err, ErrTooManyInstances) {
			refused++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if n := len(e.mod.Contexts()); n != 10 {
		t.Fatalf("%d instances registered, limit 10", n)
	}
	// The count only grows, so the 22 ids left out were refused on both
	// tries and an admitted id's other try is a re-registration.
	if refused != 44 {
		t.Fatalf("%d refusals, want 44", refused)
	}
}
