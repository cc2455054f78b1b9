package nongpu

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/layout"
	"kvdock/core/protocol"
	"kvdock/core/testkit/fakeclock"
	"kvdock/settings"
)

// The model-based test of "pool bytes have one owner at a time": workers
// copy into and out of SHM slots a step at a time while every way of
// dropping an owner (unregister from any peer, operator removal, the reaper,
// a registration of the same id from another peer, a clear, pending expiry,
// eviction under a small pool) runs in between, in random order. Half the
// workers register model m with a second layout of the same chunk size
// (bfloat16 for float16), and every chunk's bytes name its layout, so a
// chunk of one layout served to a worker of the other counts as foreign;
// lookups lock the chunks of every registered layout, as a LOOKUP does.
// Every chunk a worker reads, during its copy and at the end, must be the
// bytes stored under its key by a worker of its layout. A worker's copy counts only within its lock's TTL,
// the contract the pool promises; past it the worker is taken to have
// stopped.

const (
	modelWorkers = 3 // 1 and 2 register float16, 3 bfloat16
	modelPrompts = 6
	modelChunks  = 2  // chunks per prompt
	modelPool    = 10 // chunks the pool holds
	modelOps     = 60 // random steps per schedule
	modelWTTL    = 600 * time.Second
	modelRTTL    = 300 * time.Second
)

// modelSchedules is how many random schedules a run replays:
// KVDOCK_MODEL_SCHEDULES overrides the CI figure.
func modelSchedules(t *testing.T) int {
	if v := os.Getenv("KVDOCK_MODEL_SCHEDULES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("KVDOCK_MODEL_SCHEDULES=%q: want a positive count", v)
		}
		return n
	}
	return 10_000
}

// modelLayout is the layout worker id registers: 0 float16, 1 bfloat16.
func modelLayout(id int) int { return (id - 1) * 2 / modelWorkers }

func modelPayload(id int) protocol.RegisterPayload {
	p := payload(int64(id))
	if modelLayout(id) == 1 {
		p.DtypeStr = "bfloat16"
	}
	return p
}

// modelContent is what chunk c of prompt p holds when a worker of layout
// lay stores it.
func modelContent(lay, p, c int) []byte {
	b := make([]byte, chunkBytes)
	fill(b, byte(1+lay*modelPrompts*modelChunks+p*modelChunks+c))
	return b
}

func modelKey(p, n int) protocol.Key {
	return key(tokens(modelChunks*testChunk, uint32(1_000*(p+1))), 0, n*testChunk)
}

type modelCopy struct {
	worker  int
	prompt  int
	k       protocol.Key
	slots   []protocol.Slot
	chunks  []int // chunk index of each slot
	done    int   // slots copied
	started time.Time
	read    bool
}

type modelWorld struct {
	t       *testing.T
	rng     *rand.Rand
	clk     *fakeclock.Clock
	pool    *l1.Pool
	mod     *Module
	sess    *keys.Sessions
	layouts *layout.Registry
	copies  []*modelCopy
	log     []string
	foreign int // chunks read with bytes other than their key's
	checked int // chunks read and compared
	// byLayout counts the chunks read and compared per layout.
	byLayout [2]int
	drops    map[string]int
}

func newModelWorld(t *testing.T, seed uint64, seg string) *modelWorld {
	w := &modelWorld{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), clk: fakeclock.New(), drops: map[string]int{}}
	pool, err := l1.Open(l1.Options{
		Size: modelPool * chunkBytes, Align: 64, Plan: l1.Decision{Segment: seg},
		WriteTTL: modelWTTL, ReadTTL: modelRTTL, Policy: "LRU",
		Watermark: 0.8, Ratio: 0.2, Now: w.clk.Now, OwnerLockShare: 1, TotalLockShare: 1,
	})
	if err != nil {
		t.Fatalf("l1.Open: %v", err)
	}
	w.pool = pool
	h, err := keys.NewHasher(testChunk, "blake3")
	if err != nil {
		t.Fatal(err)
	}
	w.sess = keys.NewSessions(h, time.Hour, w.clk.Now)
	server := settings.Default().Server
	server.ChunkSize = testChunk
	server.ShmName = strptr(seg)
	w.layouts = layout.NewRegistry()
	w.mod, err = New(Deps{Pool: pool, Keys: w.sess, Layouts: w.layouts, Now: w.clk.Now}, server, settings.Default().L1)
	if err != nil {
		t.Fatal(err)
	}
	w.mod.SetTTLs(modelWTTL, modelRTTL)
	w.mod.SetLiveness(Liveness{Reap: true, Timeout: time.Second, Grace: time.Second})
	for id := 1; id <= modelWorkers; id++ {
		w.register(id, fmt.Sprintf("worker-%d", id))
	}
	return w
}

func (w *modelWorld) close() {
	w.mod.Close()
	w.pool.Close()
}

func (w *modelWorld) note(format string, args ...any) {
	w.log = append(w.log, fmt.Sprintf(format, args...))
}

func (w *modelWorld) register(id int, peer string) {
	if _, err := w.mod.RegisterThrough(modelPayload(id), []byte(peer), ""); err != nil {
		w.t.Fatalf("register %d from %s: %v", id, peer, err)
	}
}

// ensure registers the worker again when it was dropped (as a restarted
// worker would).
func (w *modelWorld) ensure(id int) {
	for _, c := range w.mod.Contexts() {
		if c.InstanceID == int64(id) {
			return
		}
	}
	w.register(id, fmt.Sprintf("worker-%d", id))
}

func (w *modelWorld) startStore() {
	id, p := 1+w.rng.IntN(modelWorkers), w.rng.IntN(modelPrompts)
	n := 1 + w.rng.IntN(modelChunks)
	w.ensure(id)
	k := modelKey(p, n)
	r, err := w.mod.PrepareStore(k, int64(id))
	w.note("w%d prepare store p%d×%d: %d slots %v", id, p, n, len(r.Slots), err)
	if err != nil || len(r.Slots) == 0 {
		return
	}
	w.copies = append(w.copies, &modelCopy{worker: id, prompt: p, k: k, slots: r.Slots, chunks: r.ChunkIndices, started: w.clk.Now()})
}

// storeNow stores prompt p whole for worker id, copy and commit at once.
func (w *modelWorld) storeNow(id, p int) {
	w.ensure(id)
	k := modelKey(p, modelChunks)
	r, err := w.mod.PrepareStore(k, int64(id))
	w.note("w%d prepare store p%d now: %d slots %v", id, p, len(r.Slots), err)
	if err != nil || len(r.Slots) == 0 {
		return
	}
	w.copies = append(w.copies, &modelCopy{worker: id, prompt: p, k: k, slots: r.Slots, chunks: r.ChunkIndices, started: w.clk.Now()})
	c := len(w.copies) - 1
	for w.copies[c].done < len(r.Slots) {
		w.step(c)
	}
	w.step(c)
}

// layoutID is the layout ID worker id's keys name.
func (w *modelWorld) layoutID(id int) uint64 {
	p := modelPayload(id)
	groups, err := w.mod.validate(p)
	if err != nil {
		w.t.Fatal(err)
	}
	return layout.ID(groups)
}

func (w *modelWorld) startRead() {
	w.read(1+w.rng.IntN(modelWorkers), w.rng.IntN(modelPrompts), 1+w.rng.IntN(modelChunks))
}

// read looks up the first n chunks of prompt p as a LOOKUP does (the
// chunks of every registered layout of the model, one lock each) and, when
// all hit, starts worker id's copy out of them; the locks of the other
// layouts' chunks go, as their own workers' retrieves would take them.
func (w *modelWorld) read(id, p, n int) {
	w.ensure(id)
	k := modelKey(p, n)
	set, err := w.sess.Keys(keys.KeyRequest{RequestID: k.RequestID, Model: k.ModelName,
		WorldSize: k.WorldSize, Worker: k.WorkerID, Tokens: k.TokenIDs, Start: k.Start, End: k.End})
	if err != nil {
		w.t.Fatal(err)
	}
	ids, groups := w.layouts.Registered(k.ModelName, k.WorldSize)
	ks := set.WithLayouts(ids, groups).All()
	locked := w.pool.ReserveReadPrefix(ks, 1)
	if locked < len(ks) {
		w.pool.FinishRead(ks[:locked], 1)
		w.note("w%d lookup p%d×%d: %d of %d keys", id, p, n, locked, len(ks))
		return
	}
	own, others := ks[:0:0], ks[:0:0]
	for _, key := range ks {
		if key.Layout == w.layoutID(id) {
			own = append(own, key)
		} else {
			others = append(others, key)
		}
	}
	w.pool.FinishRead(others, 1)
	started := w.clk.Now()
	r, err := w.mod.PrepareRetrieve(k, int64(id))
	w.note("w%d prepare retrieve p%d×%d: %v %d slots %v", id, p, n, r.Success, len(r.Slots), err)
	if err != nil || !r.Success {
		w.pool.FinishRead(own, 1)
		return
	}
	chunks := make([]int, len(r.Slots))
	for i := range chunks {
		chunks[i] = i
	}
	w.copies = append(w.copies, &modelCopy{worker: id, prompt: p, k: k, slots: r.Slots, chunks: chunks, started: started, read: true})
}

// step copies one more slot of copy i; a finished copy commits.
func (w *modelWorld) step(i int) {
	c := w.copies[i]
	if c.done == len(c.slots) {
		w.copies = append(w.copies[:i], w.copies[i+1:]...)
		if c.read {
			ok, err := w.mod.CommitRetrieve(c.k, int64(c.worker))
			w.note("w%d commit retrieve p%d: %v %v", c.worker, c.prompt, ok, err)
		} else {
			ok, err := w.mod.CommitStore(c.k, int64(c.worker), nil)
			w.note("w%d commit store p%d: %v %v", c.worker, c.prompt, ok, err)
		}
		return
	}
	s := c.slots[c.done]
	b, release := w.pool.View(s.Offset, s.Length)
	defer release()
	want := modelContent(modelLayout(c.worker), c.prompt, c.chunks[c.done])
	if c.read {
		w.checked++
		w.byLayout[modelLayout(c.worker)]++
		if !bytes.Equal(b, want) {
			w.foreign++
			w.note("w%d READ FOREIGN BYTES p%d chunk %d at %d", c.worker, c.prompt, c.chunks[c.done], s.Offset)
		}
	} else {
		copy(b, want)
		w.note("w%d wrote p%d chunk %d at %d", c.worker, c.prompt, c.chunks[c.done], s.Offset)
	}
	c.done++
}

// advance moves the clock; copies past their lock's TTL stop (the worker
// broke the pool's contract, so what it would see is not the pool's doing).
func (w *modelWorld) advance(d time.Duration) {
	w.clk.Advance(d)
	now := w.clk.Now()
	kept := w.copies[:0]
	for _, c := range w.copies {
		ttl := modelWTTL
		if c.read {
			ttl = modelRTTL
		}
		if now.Sub(c.started) < ttl {
			kept = append(kept, c)
		}
	}
	w.copies = kept
}

func (w *modelWorld) drop() {
	id := 1 + w.rng.IntN(modelWorkers)
	kinds := []string{"unregister", "remove", "reap", "id reuse", "clear", "pending expiry", "TTL"}
	kind := kinds[w.rng.IntN(len(kinds))]
	w.drops[kind]++
	w.note("drop: %s (w%d)", kind, id)
	switch kind {
	case "unregister":
		w.mod.Unregister(int64(id))
	case "remove":
		w.mod.Remove(int64(id), "the model test")
	case "reap":
		w.advance(2 * time.Second)
		w.mod.Reap()
	case "id reuse":
		w.register(id, fmt.Sprintf("intruder-%d", w.rng.IntN(1<<30)))
	case "clear":
		w.pool.Clear()
	case "pending expiry":
		// Past half of either TTL, the module gives pending transfers up.
		w.advance(time.Duration(155+w.rng.IntN(160)) * time.Second)
		w.mod.Sweep()
	case "TTL":
		w.advance(modelWTTL)
		w.mod.Sweep()
	}
}

// run plays one schedule, then lets every copy finish and reads every
// stored prompt back.
func (w *modelWorld) run() {
	for range modelOps {
		switch r := w.rng.IntN(100); {
		case r < 22:
			w.startStore()
		case r < 36:
			w.startRead()
		case r < 88 && len(w.copies) > 0:
			w.step(w.rng.IntN(len(w.copies)))
		case r < 92:
			w.advance(time.Duration(1+w.rng.IntN(30)) * time.Second)
		default:
			w.drop()
		}
	}
	for len(w.copies) > 0 {
		w.step(w.rng.IntN(len(w.copies)))
	}
	// Every prompt stored by a worker of each layout (what is resident
	// already gets no slots), then read back by one of each.
	for p := range modelPrompts {
		w.storeNow(1, p)
		w.storeNow(modelWorkers, p)
	}
	for p := range modelPrompts {
		w.read(1, p, modelChunks)
		w.read(modelWorkers, p, modelChunks)
	}
	for len(w.copies) > 0 {
		w.step(w.rng.IntN(len(w.copies)))
	}
}

func TestHostileDropPathsNeverServeForeignBytes(t *testing.T) {
	n := modelSchedules(t)
	seg := l1.NormalizeName(uniqueName(t))
	var foreign, checked int
	var byLayout [2]int
	drops := map[string]int{}
	for s := range n {
		w := newModelWorld(t, uint64(s), seg)
		w.run()
		w.close()
		foreign += w.foreign
		checked += w.checked
		byLayout[0] += w.byLayout[0]
		byLayout[1] += w.byLayout[1]
		for k, v := range w.drops {
			drops[k] += v
		}
		if w.foreign > 0 && foreign == w.foreign {
			t.Errorf("schedule %d read foreign bytes; its steps:\n%s", s, strings.Join(w.log, "\n"))
		}
	}
	t.Logf("%d schedules: %d chunks read and compared (%d float16, %d bfloat16), %d with foreign bytes; drops %v",
		n, checked, byLayout[0], byLayout[1], foreign, drops)
	if foreign > 0 {
		t.Fatalf("%d of %d chunks read were another key's bytes", foreign, checked)
	}
	if checked < n || min(byLayout[0], byLayout[1]) < n/4 {
		t.Fatalf("only %d chunks read in %d schedules (%v per layout): the model reads too little to judge", checked, n, byLayout)
	}
	for _, k := range []string{"unregister", "remove", "reap", "id reuse", "clear", "pending expiry", "TTL"} {
		if drops[k] < n/20 {
			t.Fatalf("drop path %q ran %d times in %d schedules", k, drops[k], n)
		}
	}
}
