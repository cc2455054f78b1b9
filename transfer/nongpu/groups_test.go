package nongpu

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"kvdock/core/keys"
	"kvdock/core/layout"
	"kvdock/core/protocol"
	"kvdock/core/workers"
	"kvdock/transfer/torchpickle"
)

// hybridPayload registers a two-group model: group 0 is the flat layout
// ([2, 2, 16, 4] float16), group 1 [2, 1, 16, 8] float32 (8-token blocks).
func hybridPayload(id int64) protocol.RegisterPayload {
	p := payload(id)
	p.GroupLayouts = []protocol.GroupLayout{
		{BlockSize: 8, NumLayers: 2, HiddenDimSize: 4, DtypeStr: "float16", TokensPerBlock: 8},
		{BlockSize: 8, NumLayers: 1, HiddenDimSize: 8, DtypeStr: "float32", TokensPerBlock: 8},
	}
	return p
}

const group1Bytes = 2 * 1 * testChunk * 8 * 4

func group1Tensor(seed byte) torchpickle.Tensor {
	d := make([]byte, group1Bytes)
	fill(d, seed)
	return torchpickle.Tensor{Dtype: "float32", Shape: []int{2, 1, testChunk, 8}, Data: d}
}

func pickledGroups(t *testing.T, groups ...[]torchpickle.Tensor) []byte {
	t.Helper()
	b, err := torchpickle.AppendEncodeGroups(nil, groups)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (e *env) registerHybrid(id int64) {
	e.t.Helper()
	if _, err := e.mod.RegisterThrough(hybridPayload(id), nil, ""); err != nil {
		e.t.Fatalf("Register hybrid: %v", err)
	}
}

// lookupLockGroups takes the read locks LOOKUP takes for a hybrid model:
// every group of every chunk; it reports whether all were there (the locks
// of a partial hit are released).
func (e *env) lookupLockGroups(k protocol.Key, groups int) bool {
	e.t.Helper()
	var all []keys.ObjectKey
	for g := range groups {
		all = append(all, keys.InGroup(e.objectKeys(k), uint32(g))...)
	}
	n := e.pool.ReserveReadPrefix(all, 1)
	if n != len(all) {
		e.pool.FinishRead(all[:n], 1)
		return false
	}
	return true
}

// TestHybridRegistration: two groups get two layouts, sized per group, in
// the registry (LOOKUP expands over them) and in Contexts; hostile group
// lists are refused whole and change nothing.
func TestHybridRegistration(t *testing.T) {
	e := newEnv(t, false, 1<<20)
	e.registerHybrid(1)
	gs, ok := e.layouts.Groups("m", 1)
	if !ok || len(gs) != 2 || gs[0].Bytes != chunkBytes || gs[1].Bytes != group1Bytes ||
		gs[1].Dtype != "float32" || !slices.Equal(gs[1].Shape, []int{2, 1, testChunk, 8}) {
		t.Fatalf("registry groups = %+v", gs)
	}
	if n := e.layouts.GroupCount("m", 1); n != 2 {
		t.Fatalf("GroupCount = %d", n)
	}
	c := e.mod.Contexts()
	if len(c) != 1 || len(c[0].Groups) != 2 || c[0].Groups[1].Bytes != group1Bytes {
		t.Fatalf("contexts = %+v", c)
	}
	if st := e.mod.Status()["non_cuda_context_meta"].(map[string]any)["1"].(map[string]any); st["num_groups"] != 2 {
		t.Fatalf("status meta = %v", st)
	}

	bad := func(name string, mut func(p *protocol.RegisterPayload), want string) {
		t.Helper()
		p := hybridPayload(9)
		mut(&p)
		_, err := e.mod.RegisterThrough(p, nil, "")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", name, err, want)
		}
		if len(e.mod.Contexts()) != 1 {
			t.Fatalf("%s: a refused registration was kept", name)
		}
	}
	bad("too many groups", func(p *protocol.RegisterPayload) {
		for len(p.GroupLayouts) <= layout.MaxGroups {
			p.GroupLayouts = append(p.GroupLayouts, p.GroupLayouts[0])
		}
	}, "at most 16 KV groups")
	bad("bad dtype in group 1", func(p *protocol.RegisterPayload) { p.GroupLayouts[1].DtypeStr = "complex" }, "group 1")
	bad("block larger than chunk", func(p *protocol.RegisterPayload) { p.GroupLayouts[1].TokensPerBlock = testChunk + 1 }, "more than the 16-token chunk")
	bad("no block size", func(p *protocol.RegisterPayload) {
		p.GroupLayouts[0].BlockSize, p.GroupLayouts[0].TokensPerBlock = 0, 0
	}, "group 0")
	bad("overflowing size", func(p *protocol.RegisterPayload) {
		p.GroupLayouts[1].NumLayers, p.GroupLayouts[1].HiddenDimSize = 1<<30, 1<<30
	}, "exceed")

	// Other groups, or one group, for the same model register beside it,
	// each under its own layout ID.
	other := hybridPayload(2)
	other.GroupLayouts[1].HiddenDimSize = 16
	plain := hybridPayload(3)
	plain.GroupLayouts = nil
	for _, p := range []protocol.RegisterPayload{other, plain} {
		if _, err := e.mod.RegisterThrough(p, nil, ""); err != nil {
			t.Fatalf("instance %d with other groups: %v", p.InstanceID, err)
		}
	}
	if ids, groups := e.layouts.Registered("m", 1); len(ids) != 3 || groups[0] != 2 || groups[1] != 2 || groups[2] != 1 {
		t.Fatalf("registered layouts %x, groups %v", ids, groups)
	}
	e.mod.Unregister(2)
	e.mod.Unregister(3)

	// The same id again, with other groups: the first registration stays.
	p := hybridPayload(1)
	p.GroupLayouts[1].HiddenDimSize = 16
	if _, err := e.mod.RegisterThrough(p, nil, ""); err != nil {
		t.Fatal(err)
	}
	if gs, _ := e.layouts.Groups("m", 1); gs[1].Bytes != group1Bytes {
		t.Fatalf("re-registration replaced the groups: %+v", gs)
	}
	e.mod.Unregister(1)
	if e.layouts.GroupCount("m", 1) != 0 {
		t.Fatal("groups outlived the last instance")
	}
}

// TestHybridPickleGroups: COMMIT_STORE_GROUP stores one group under its own
// keys; a chunk with only one group committed is a miss (never half
// served); once both are, PREPARE_RETRIEVE answers a group-major pickle
// with each group's bytes. Hostile commits change nothing.
func TestHybridPickleGroups(t *testing.T) {
	e := newEnv(t, false, 1<<20)
	e.registerHybrid(1)
	k := key(tokens(2*testChunk, 5), 0, 2*testChunk)
	g0 := []torchpickle.Tensor{tensorOf(1), tensorOf(2)}
	g1 := []torchpickle.Tensor{group1Tensor(3), group1Tensor(4)}

	// Hostile: group out of range, negative, empty data, two groups in a
	// group commit, a flat (ungrouped) pickle, wrong layout, wrong count.
	for name, call := range map[string]func() (bool, error){
		"group 2":        func() (bool, error) { return e.mod.CommitStoreGroup(k, 1, 2, pickledGroups(t, g1)) },
		"group -1":       func() (bool, error) { return e.mod.CommitStoreGroup(k, 1, -1, pickledGroups(t, g1)) },
		"huge group":     func() (bool, error) { return e.mod.CommitStoreGroup(k, 1, 1<<40, pickledGroups(t, g1)) },
		"empty":          func() (bool, error) { return e.mod.CommitStoreGroup(k, 1, 1, nil) },
		"two groups":     func() (bool, error) { return e.mod.CommitStoreGroup(k, 1, 1, pickledGroups(t, g0, g1)) },
		"flat pickle":    func() (bool, error) { return e.mod.CommitStoreGroup(k, 1, 1, pickled(t, g1...)) },
		"unknown id":     func() (bool, error) { return e.mod.CommitStoreGroup(k, 77, 1, pickledGroups(t, g1)) },
		"group 1 as 0":   func() (bool, error) { return e.mod.CommitStoreGroup(k, 1, 0, pickledGroups(t, g1)) },
		"one chunk of 2": func() (bool, error) { return e.mod.CommitStoreGroup(k, 1, 1, pickledGroups(t, g1[:1])) },
	} {
		ok, err := call()
		if ok {
			t.Errorf("%s: answered true", name)
		}
		if strings.HasPrefix(name, "group") && name != "group 1 as 0" && err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if e.lookupLockGroups(k, 2) {
		t.Fatal("hostile commits stored a whole chunk")
	}
	// "one chunk of 2" stored chunk 0 of group 1 only (no group 0): still a miss.

	if ok, err := e.mod.CommitStoreGroup(k, 1, 1, pickledGroups(t, g1)); !ok || err != nil {
		t.Fatalf("commit group 1 = %v, %v", ok, err)
	}
	if e.lookupLockGroups(k, 2) {
		t.Fatal("group 1 alone is a hit: a half-written chunk would be served")
	}
	if r, err := e.mod.PrepareRetrieve(k, 1); err != nil || r.Success {
		t.Fatalf("retrieve with group 0 missing = %+v, %v", r.Success, err)
	}
	if ok, err := e.mod.CommitStoreGroup(k, 1, 0, pickledGroups(t, g0)); !ok || err != nil {
		t.Fatalf("commit group 0 = %v, %v", ok, err)
	}
	if !e.lookupLockGroups(k, 2) {
		t.Fatal("both groups committed, still a miss")
	}
	r, err := e.mod.PrepareRetrieve(k, 1)
	if err != nil || !r.Success || len(r.Data) == 0 {
		t.Fatalf("retrieve = %+v, %v", r.Success, err)
	}
	got, err := torchpickle.DecodeGroups(r.Data, torchpickle.Limits{})
	if err != nil || len(got) != 2 || len(got[0]) != 2 || len(got[1]) != 2 {
		t.Fatalf("reply groups: %v", err)
	}
	for g, want := range [][]torchpickle.Tensor{g0, g1} {
		for i := range want {
			if got[g][i].Dtype != want[i].Dtype || !slices.Equal(got[g][i].Shape, want[i].Shape) || !bytes.Equal(got[g][i].Data, want[i].Data) {
				t.Fatalf("group %d chunk %d came back different", g, i)
			}
		}
	}
	// The groups are distinct objects: group 1's keys hold group 1's bytes.
	if e.cached(k) != 2 {
		t.Fatal("group 0 keys not cached")
	}

	// One COMMIT_STORE with both groups (the single-message form).
	k2 := key(tokens(testChunk, 900), 0, testChunk)
	if ok, err := e.mod.CommitStore(k2, 1, pickledGroups(t, g0[:1])); ok || err != nil {
		t.Fatalf("commit of 1 group for a 2-group model = %v, %v; want false", ok, err)
	}
	if ok, err := e.mod.CommitStore(k2, 1, pickledGroups(t, g0[:1], g1[:1])); !ok || err != nil {
		t.Fatalf("commit of both groups = %v, %v", ok, err)
	}
	if !e.lookupLockGroups(k2, 2) {
		t.Fatal("single-message store not a hit")
	}
}

// TestHybridSHM: PREPARE_STORE hands out slots per group (group-major, each
// of its group's layout, chunk indices within the group, group_ids), one
// COMMIT_STORE publishes all of them, and PREPARE_RETRIEVE answers slots
// per group with group_ids; a worker that sends pickled groups instead is
// switched to PICKLE as a plain worker is.
func TestHybridSHM(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.registerHybrid(1)
	k := key(tokens(2*testChunk, 7), 0, 2*testChunk)
	ps, err := e.mod.PrepareStore(k, 1)
	if err != nil || !ps.Shm || len(ps.Slots) != 4 {
		t.Fatalf("prepare = %+v, %v", ps, err)
	}
	if !slices.Equal(ps.GroupIDs, []int{0, 0, 1, 1}) || !slices.Equal(ps.ChunkIndices, []int{0, 1, 0, 1}) {
		t.Fatalf("group ids %v, chunk indices %v", ps.GroupIDs, ps.ChunkIndices)
	}
	if ps.Slots[0].Length != chunkBytes || ps.Slots[2].Length != group1Bytes || ps.Slots[2].Dtype != "float32" ||
		!slices.Equal(ps.Slots[3].Shape, []int{2, 1, testChunk, 8}) {
		t.Fatalf("slots %+v", ps.Slots)
	}
	for i, s := range ps.Slots {
		fill(view(t, e.pool, s.Offset, s.Length), byte(10+i))
	}
	if e.lookupLockGroups(k, 2) {
		t.Fatal("prepared, uncommitted slots are readable")
	}
	if ok, err := e.mod.CommitStore(k, 1, nil); !ok || err != nil {
		t.Fatalf("commit = %v, %v", ok, err)
	}
	if !e.lookupLockGroups(k, 2) {
		t.Fatal("committed groups are a miss")
	}
	r, err := e.mod.PrepareRetrieve(k, 1)
	if err != nil || !r.Success || len(r.Slots) != 4 || !slices.Equal(r.GroupIDs, []int{0, 0, 1, 1}) {
		t.Fatalf("retrieve = %+v, %v", r, err)
	}
	for i, s := range r.Slots {
		want := make([]byte, s.Length)
		fill(want, byte(10+i))
		if s.Length != ps.Slots[i].Length || !bytes.Equal(view(t, e.pool, s.Offset, s.Length), want) {
			t.Fatalf("slot %d holds other bytes", i)
		}
	}
	if ok, _ := e.mod.CommitRetrieve(k, 1); !ok {
		t.Fatal("commit retrieve false")
	}
	// A second prepare of cached chunks: nothing reserved, empty lists.
	if ps, err := e.mod.PrepareStore(k, 1); err != nil || len(ps.Slots) != 0 || ps.GroupIDs == nil {
		t.Fatalf("prepare of cached chunks = %+v, %v", ps, err)
	}

	// An era-C worker sends COMMIT_STORE_GROUP with pickles: proven, PICKLE.
	k2 := key(tokens(testChunk, 300), 0, testChunk)
	if ok, err := e.mod.CommitStoreGroup(k2, 1, 1, pickledGroups(t, []torchpickle.Tensor{group1Tensor(5)})); !ok || err != nil {
		t.Fatalf("group commit on SHM = %v, %v", ok, err)
	}
	if m := e.mod.Contexts()[0].Mode; m != workers.ModePickle {
		t.Fatalf("mode %s after a proven pickle group commit", m)
	}
}

// TestHybridPublishedPerGroup: the tiers are told of each group's objects
// with that group's own layout (so each tier value carries its group's
// layout and fingerprint), after an SHM commit of all groups and after a
// group commit alike.
func TestHybridPublishedPerGroup(t *testing.T) {
	e, rec := recordingEnv(t, true)
	e.registerHybrid(1)
	k := key(tokens(testChunk, 70), 0, testChunk)
	if _, err := e.mod.PrepareStore(k, 1); err != nil {
		t.Fatal(err)
	}
	if ok, err := e.mod.CommitStore(k, 1, nil); !ok || err != nil {
		t.Fatalf("commit = %v, %v", ok, err)
	}
	got := rec.got()
	if len(got) != 2 || len(rec.lays) != 2 || got[0].Group != 0 || got[1].Group != 1 ||
		rec.lays[0].Bytes != chunkBytes || rec.lays[1].Bytes != group1Bytes || rec.lays[1].Dtype != "float32" {
		t.Fatalf("published %v with %v", got, rec.lays)
	}
	k2 := key(tokens(testChunk, 170), 0, testChunk)
	if ok, err := e.mod.CommitStoreGroup(k2, 1, 1, pickledGroups(t, []torchpickle.Tensor{group1Tensor(9)})); !ok || err != nil {
		t.Fatalf("group commit = %v, %v", ok, err)
	}
	if got := rec.got(); len(got) != 3 || got[2].Group != 1 || rec.lays[2].Bytes != group1Bytes {
		t.Fatalf("group commit published %v with %v", got, rec.lays)
	}
}

// TestHybridConcurrentGroupCommits: many prompts' groups committed from
// concurrent goroutines, in either order, while others look up and
// retrieve: every chunk that hits serves exactly its own groups' bytes.
func TestHybridConcurrentGroupCommits(t *testing.T) {
	e := newEnv(t, false, 4<<20)
	e.registerHybrid(1)
	const prompts = 24
	type prompt struct {
		k      protocol.Key
		g0, g1 []torchpickle.Tensor
		wire   [2][]byte // each group's COMMIT_STORE_GROUP pickle
	}
	ps := make([]prompt, prompts)
	for i := range ps {
		k := key(tokens(testChunk, uint32(1000*i+1)), 0, testChunk)
		k.RequestID = "req" + strings.Repeat("x", i)
		g0, g1 := []torchpickle.Tensor{tensorOf(byte(i))}, []torchpickle.Tensor{group1Tensor(byte(100 + i))}
		ps[i] = prompt{k, g0, g1, [2][]byte{pickledGroups(t, g0), pickledGroups(t, g1)}}
	}
	errs := make(chan string, 4*prompts)
	var wg sync.WaitGroup
	for i := range ps {
		for _, g := range []int64{1, 0} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if ok, err := e.mod.CommitStoreGroup(ps[i].k, 1, g, ps[i].wire[g]); !ok || err != nil {
					errs <- fmt.Sprintf("prompt %d group %d: %v %v", i, g, ok, err)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := e.mod.PrepareRetrieve(ps[i].k, 1) // no LOOKUP lock: a miss, or bad bytes if wrong
			if err != nil || r.Success {
				errs <- fmt.Sprintf("prompt %d: unlocked retrieve %v %v", i, r.Success, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for s := range errs {
		t.Error(s)
	}
	for i, p := range ps {
		if !e.lookupLockGroups(p.k, 2) {
			t.Fatalf("prompt %d: not a hit after both groups", i)
		}
		r, err := e.mod.PrepareRetrieve(p.k, 1)
		if err != nil || !r.Success {
			t.Fatalf("prompt %d: retrieve %v %v", i, r.Success, err)
		}
		got, err := torchpickle.DecodeGroups(r.Data, torchpickle.Limits{})
		if err != nil || !bytes.Equal(got[0][0].Data, p.g0[0].Data) || !bytes.Equal(got[1][0].Data, p.g1[0].Data) {
			t.Fatalf("prompt %d: bytes differ (%v)", i, err)
		}
	}
}

// TestPickleGateCountsEveryGroup: what a hybrid pickle store or retrieve is
// admitted for under --max-inflight-pickle-mb is every KV group's chunk,
// not group 0's alone.
func TestPickleGateCountsEveryGroup(t *testing.T) {
	e := newEnv(t, false, 1<<20)
	e.registerHybrid(1)
	plain := payload(2)
	plain.ModelName = "plain"
	if _, err := e.mod.RegisterThrough(plain, nil, ""); err != nil {
		t.Fatal(err)
	}
	k := key(tokens(2*testChunk, 5), 0, 2*testChunk)
	if n, ok := e.mod.pickleStoreBytes(k, 1); !ok || n != 2*(chunkBytes+group1Bytes) {
		t.Fatalf("hybrid: %d bytes (%v), want %d (two chunks of both groups)", n, ok, 2*(chunkBytes+group1Bytes))
	}
	if n, ok := e.mod.pickleStoreBytes(k, 2); !ok || n != 2*chunkBytes {
		t.Fatalf("plain: %d bytes (%v), want %d", n, ok, 2*chunkBytes)
	}
}
