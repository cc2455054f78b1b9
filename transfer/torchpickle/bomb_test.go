package torchpickle

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Work and memory bombs: small pickles that made the decoder spend time or
// memory out of proportion to their length. Each test asserts the bound that
// now holds; on the baseline each one ran for minutes or used gigabytes.

// bombKey is the i-th distinct three-character storage key (i < 17576).
func bombKey(i int) string {
	return string([]byte{'a' + byte(i/676%26), 'a' + byte(i/26%26), 'a' + byte(i%26)})
}

// cpuBombContainer is a valid legacy container whose saved-object pickle
// announces distinct storages, then looks the last one up again lookups
// times (each lookup scanned every earlier key on the baseline).
func cpuBombContainer(distinct, lookups int) []byte {
	p := pb{}.op(opPROTO, 2, opLONG1, 10).op(legacyMagic[:]...).op(opSTOP).
		op(opPROTO, 2, opBININT2, 0xe9, 0x03, opSTOP).op([]byte(legacySysInfo)...).
		op(opPROTO, 2).short("storage").op(opBINPUT, 0).global("torch", "FloatStorage").op(opBINPUT, 1).
		short("cpu").op(opBINPUT, 2, opPOP, opPOP, opPOP)
	for i := 0; i < distinct; i++ {
		p = p.op(opMARK, opBINGET, 0, opBINGET, 1).short(bombKey(i)).op(opBINGET, 2, opBININT1, 1, opNONE, opTUPLE)
		if i == distinct-1 {
			p = p.op(opBINPUT, 3)
		}
		p = p.op(opBINPERSID, opPOP)
	}
	for i := 0; i < lookups; i++ {
		p = p.op(opBINGET, 3, opBINPERSID, opPOP)
	}
	p = p.op(opBINGET, 3, opBINPERSID, opSTOP)
	p = p.op(opPROTO, 2, opEMPTY_LIST).short(bombKey(distinct-1)).op(opAPPEND, opSTOP)
	p = binary.LittleEndian.AppendUint64(p, 1)
	return append(p, 1, 2, 3, 4)
}

// cpuBomb loads one memoised container parses times and returns an empty list.
func cpuBomb(parses int) []byte {
	p := pb{}.op(opPROTO, 4).stackGlobal("torch.storage", "_load_from_bytes").op(opBINPUT, 0).
		bytes(cpuBombContainer(600, 12000)).op(opTUPLE1, opBINPUT, 1, opPOP, opPOP)
	for i := 0; i < parses; i++ {
		p = p.op(opBINGET, 0, opBINGET, 1, opREDUCE, opPOP)
	}
	return p.op(opEMPTY_LIST, opSTOP)
}

// decodeWithin runs Decode and fails the test if it has not returned within d
// (the baseline took minutes; the goroutine is left behind in that case).
func decodeWithin(t *testing.T, data []byte, lim Limits, d time.Duration) ([]Tensor, error, time.Duration) {
	t.Helper()
	type res struct {
		ts  []Tensor
		err error
	}
	done := make(chan res, 1)
	start := time.Now()
	go func() {
		ts, err := Decode(data, lim)
		done <- res{ts, err}
	}()
	select {
	case r := <-done:
		return r.ts, r.err, time.Since(start)
	case <-time.After(d):
		t.Fatalf("Decode of %d bytes still running after %v", len(data), d)
		return nil, nil, 0
	}
}

func TestCPUBombMemoisedContainer(t *testing.T) {
	data := cpuBomb(4096)
	if len(data) > 100<<10 {
		t.Fatalf("bomb is %d bytes, want under 100 KiB", len(data))
	}
	ts, err, took := decodeWithin(t, data, Limits{}, 10*time.Second)
	t.Logf("%d-byte bomb: %v in %v", len(data), err, took)
	if err != nil || len(ts) != 0 {
		t.Fatalf("Decode: %d tensors, %v; want an empty list", len(ts), err)
	}
	if took > 2*time.Second {
		t.Fatalf("Decode took %v, want well under 2 s", took)
	}
	// The container is read once: the work is about one step per input byte.
	if _, u, err := decode(data, Limits{}); err != nil || u.work > 2*int64(len(data)) {
		t.Fatalf("Decode: %v after %d steps for %d bytes", err, u.work, len(data))
	}
}

func TestCPUBombStorageRefs(t *testing.T) {
	// One container, its header allowed to be 8 MiB: 4096 storages, then a
	// million look-ups of the last one, each a scan of all 4096 keys on the
	// baseline (4 G comparisons, 54 s).
	p := pb{}.op(opPROTO, 4, opEMPTY_LIST).stackGlobal("torch.storage", "_load_from_bytes").
		bytes(cpuBombContainer(4096, 1<<20)).op(opTUPLE1, opREDUCE, opPOP, opSTOP)
	_, err, took := decodeWithin(t, p, Limits{MaxStorageHeader: 8 << 20}, time.Minute)
	t.Logf("%d bytes: %v in %v", len(p), err, took)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	// 0.25 s here, 3 s under -race on a loaded machine; 54 s on the baseline.
	if took > 10*time.Second {
		t.Fatalf("one container with a million storage references took %v", took)
	}
}

// allocDuring returns the bytes allocated by Decode(data, Limits{}) and its error.
func allocDuring(data []byte) (uint64, error) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := Decode(data, Limits{})
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, err
}

// memoryBombs are size-byte pickles that, on the baseline, made Decode retain
// 16–32 bytes per input byte.
func memoryBombs(size int) map[string][]byte {
	bombs := map[string][]byte{}
	// A list grown by APPENDS of DUPs of one small int.
	p := pb{}.op(opPROTO, 4, opEMPTY_LIST)
	for len(p) < size {
		p = p.op(opMARK, opBININT1, 7).op(make([]byte, 4000)...)
		for i := len(p) - 4000; i < len(p); i++ {
			p[i] = opDUP
		}
		p = p.op(opAPPENDS)
	}
	bombs["list"] = p.op(opSTOP)
	// Tuples of DUPs, each kept in the memo.
	p = pb{}.op(opPROTO, 4)
	for i := 0; len(p) < size; i++ {
		p = p.op(opMARK, opBININT1, 7).op([]byte(strings.Repeat(string(rune(opDUP)), 4000))...).op(opTUPLE, opLONG_BINPUT)
		p = pb(binary.LittleEndian.AppendUint32(p, uint32(i))).op(opPOP)
	}
	bombs["memoised tuples"] = p.op(opEMPTY_LIST, opSTOP)
	// One dict with a key set again and again (kept as many entries).
	p = pb{}.op(opPROTO, 4, opEMPTY_DICT)
	for len(p) < size {
		p = p.op(opMARK, opBININT1, 7).op([]byte(strings.Repeat(string(rune(opDUP)), 4001))...).op(opSETITEMS)
	}
	bombs["dict"] = p.op(opPOP, opEMPTY_LIST, opSTOP)
	// Empty dicts kept in the memo (64 bytes each for two input bytes).
	p = pb{}.op(opPROTO, 4)
	for len(p) < size {
		p = p.op(opEMPTY_DICT, opMEMOIZE, opPOP)
	}
	bombs["memoised dicts"] = p.op(opEMPTY_LIST, opSTOP)
	return bombs
}

func TestMemoryBombs(t *testing.T) {
	const size = 4 << 20
	for name, data := range memoryBombs(size) {
		alloc, err := allocDuring(data)
		t.Logf("%s: %d input bytes, %d allocated (%.2fx), %v", name, len(data), alloc, float64(alloc)/float64(len(data)), err)
		if !errors.Is(err, ErrLimit) {
			t.Errorf("%s: %v, want ErrLimit", name, err)
		}
		if limit := 2*uint64(len(data)) + 1<<20; alloc > limit {
			t.Errorf("%s: %d bytes allocated for %d input bytes, want at most %d", name, alloc, len(data), limit)
		}
	}
}

// sharedTensors is a list of n tensors over one memoised uint8 storage of
// storageLen elements, all with the same memoised size and stride tuples.
func sharedTensors(n, storageLen int, size, stride []int64) []byte {
	p := pb{}.op(opPROTO, 4, opEMPTY_LIST).
		stackGlobal("torch._utils", "_rebuild_tensor_v2").op(opBINPUT, 0).
		stackGlobal("torch.storage", "_load_from_bytes").
		bytes(container("ByteStorage", uint64(storageLen), uint64(storageLen), make([]byte, storageLen))).
		op(opTUPLE1, opREDUCE, opBINPUT, 1, opMARK)
	for _, s := range size {
		p = appendInt(p, s)
	}
	p = p.op(opTUPLE, opBINPUT, 2, opMARK)
	for _, s := range stride {
		p = appendInt(p, s)
	}
	p = p.op(opTUPLE, opBINPUT, 3).stackGlobal("collections", "OrderedDict").op(opEMPTY_TUPLE, opREDUCE, opBINPUT, 4)
	p = p.op(opPOP, opPOP, opPOP, opPOP, opPOP, opMARK)
	for i := 0; i < n; i++ {
		p = p.op(opBINGET, 0, opMARK, opBINGET, 1, opBININT1, 0, opBINGET, 2, opBINGET, 3, opNEWFALSE, opBINGET, 4, opTUPLE, opREDUCE)
	}
	return p.op(opAPPENDS, opSTOP)
}

func TestStridedCopyOfManyDims(t *testing.T) {
	// [n, 1, 1, …] with a stride of 2: n one-byte copies, and on the baseline
	// a walk over all 4000 dimensions after each (20 s for this 1 MB pickle).
	const n = 1 << 19
	size, stride := []int64{n}, []int64{2}
	for range 4000 {
		size, stride = append(size, 1), append(stride, 1)
	}
	data := sharedTensors(1, 2*n, size, stride)
	_, err, took := decodeWithin(t, data, Limits{}, 10*time.Second)
	if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "dimensions") {
		t.Fatalf("4001 dimensions: %v (in %v), want ErrLimit naming dimensions", err, took)
	}
	// The same within 64 dimensions decodes, and the unit dimensions cost nothing.
	data = sharedTensors(1, 2*n, size[:64], stride[:64])
	ts, u, err := decode(data, Limits{})
	if err != nil || len(ts) != 1 || len(ts[0].Data) != n {
		t.Fatalf("64 dimensions: %v", err)
	}
	if u.work > 3*int64(len(data)) {
		t.Fatalf("64 dimensions: %d steps for %d input bytes", u.work, len(data))
	}
}

func TestSharedShapeTupleManyTensors(t *testing.T) {
	// A 4000-dimension shape fetched from the memo by 4096 tensors: on the
	// baseline each made copies of size, stride and shape (403 MB allocated
	// for an 82 KB pickle).
	size, stride := make([]int64, 4000), make([]int64, 4000)
	for i := range size {
		size[i], stride[i] = 1, 1
	}
	data := sharedTensors(4096, 1, size, stride)
	alloc, err := allocDuring(data)
	if !errors.Is(err, ErrLimit) {
		t.Fatalf("%v, want ErrLimit", err)
	}
	if limit := 4*uint64(len(data)) + 1<<20; alloc > limit {
		t.Fatalf("%d bytes allocated for %d input bytes, want at most %d", alloc, len(data), limit)
	}
	// 4096 four-dimension views of one byte, 18 input bytes each: each needs
	// about 17 slots, so this too runs out of items, with memory bounded.
	data = sharedTensors(4096, 1, size[:4], stride[:4])
	alloc, err = allocDuring(data)
	if !errors.Is(err, ErrLimit) {
		t.Fatalf("4096 views: %v, want ErrLimit", err)
	}
	if limit := 4*uint64(len(data)) + 1<<20; alloc > limit {
		t.Fatalf("4096 views: %d bytes allocated for %d input bytes, want at most %d", alloc, len(data), limit)
	}
	// 400 of them fit.
	data = sharedTensors(400, 1, size[:4], stride[:4])
	if ts, err := Decode(data, Limits{}); err != nil || len(ts) != 400 {
		t.Fatalf("400 views: %v", err)
	}
}

func TestWorkBudgetIsAnError(t *testing.T) {
	pkl := cpuBomb(4)
	_, err := Decode(pkl, Limits{MaxWork: 10000})
	if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "work budget of 10000 steps") {
		t.Fatalf("%v, want ErrLimit naming the work budget", err)
	}
	_, err = Decode(pkl, Limits{MaxItems: 100})
	if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "more than 100 values retained") {
		t.Fatalf("%v, want ErrLimit naming the item budget", err)
	}
}

// TestLegitInputsWithinBudget: torch's own pickles (every fixture) and the
// encoder's output stay far inside the default budgets.
func TestLegitInputsWithinBudget(t *testing.T) {
	inputs := map[string][]byte{}
	fs, err := filepath.Glob(filepath.Join("testdata", "fixtures", "*.pkl"))
	if err != nil || len(fs) == 0 {
		t.Fatalf("no fixtures (%v)", err)
	}
	for _, f := range fs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		inputs[filepath.Base(f)] = b
	}
	// As many tensors as a message may hold, each of 512 bytes (torch's own
	// pickles of these are decoded by TestInteropWithInstalledTorch).
	ts := make([]Tensor, 4096)
	for i := range ts {
		ts[i] = Tensor{Dtype: "float16", Shape: []int{2, 4, 8, 4}, Data: make([]byte, 512)}
	}
	enc, err := AppendEncode(nil, ts)
	if err != nil {
		t.Fatal(err)
	}
	inputs["4096 tensors of 512 bytes"] = enc
	for name, b := range inputs {
		_, u, err := decode(b, Limits{})
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if u.work > 2*int64(len(b))+1000 {
			t.Errorf("%s: %d steps for %d bytes", name, u.work, len(b))
		}
		if u.items > int64(len(b))/4+256 {
			t.Errorf("%s: %d items retained for %d bytes", name, u.items, len(b))
		}
	}
}

func TestMemoDenseAndSparse(t *testing.T) {
	// Index 100 goes to the sparse map, then 0..101 fill the dense part
	// around it; every index reads back what was put there last.
	p := pb{}.op(opPROTO, 4, opBININT1, 100, opBINPUT, 100, opPOP)
	for i := 0; i <= 101; i++ {
		if i != 100 {
			p = p.op(opBININT1, byte(i), opBINPUT, byte(i), opPOP)
		}
	}
	p = p.op(opBININT1, 1, opBINPUT, 0, opPOP, opMARK)
	for i := 0; i <= 101; i++ {
		p = p.op(opBINGET, byte(i))
	}
	p = p.op(opTUPLE, opPOP, opEMPTY_LIST, opMARK, opBINGET, 100, opBINGET, 0, opBINGET, 101, opAPPENDS, opSTOP)
	m := newMachine(p, &decodeState{lim: Limits{}.resolve(len(p)), emptyTuple: &tuple{depth: 1}}, false)
	v, err := m.run()
	if err != nil {
		t.Fatal(err)
	}
	got := v.(*list).items
	if len(got) != 3 || got[0] != int64(100) || got[1] != int64(1) || got[2] != int64(101) {
		t.Fatalf("memo read back %v, want [100 1 101]", got)
	}
	if m.memoSize != 102 {
		t.Fatalf("memo has %d entries, want 102", m.memoSize)
	}
}

// repeatTo appends unit to prefix until it is n bytes long, then suffix.
func repeatTo(prefix pb, unit []byte, n int, suffix ...byte) []byte {
	p := append(pb{}, prefix...)
	for len(p) < n {
		p = append(p, unit...)
	}
	return append(p, suffix...)
}

// TestCostOfOpcodePatterns: the cheapest ways found to make the decoder
// allocate or work per input byte stay within FuzzDecode's bounds, with the
// default limits and with tight ones.
func TestCostOfOpcodePatterns(t *testing.T) {
	const n = 64 << 10
	end := []byte{opEMPTY_LIST, opSTOP}
	strs := []byte{opMARK}
	for range 4000 {
		strs = append(strs, opSHORT_BINUNICODE, 0)
	}
	strs = append(strs, opPOP_MARK)
	cases := map[string][]byte{
		"boxed strs":         repeatTo(pb{}.op(opPROTO, 4), []byte{opSHORT_BINUNICODE, 0, opPOP}, n, end...),
		"a frame of strs":    repeatTo(pb{}.op(opPROTO, 4), strs, n, end...),
		"TUPLE1":             repeatTo(pb{}.op(opPROTO, 4), []byte{opNONE, opTUPLE1, opPOP}, n, end...),
		"EMPTY_LIST":         repeatTo(pb{}.op(opPROTO, 4), []byte{opEMPTY_LIST, opPOP}, n, end...),
		"EMPTY_DICT":         repeatTo(pb{}.op(opPROTO, 4), []byte{opEMPTY_DICT, opPOP}, n, end...),
		"MEMOIZE":            repeatTo(pb{}.op(opPROTO, 4), []byte{opNONE, opMEMOIZE, opPOP}, n, end...),
		"negative LONG1":     repeatTo(pb{}.op(opPROTO, 4), []byte{opLONG1, 1, 0xff, opPOP}, n, end...),
		"big LONG1":          repeatTo(pb{}.op(opPROTO, 4), []byte{opLONG1, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, opPOP}, n, end...),
		"small dicts":        repeatTo(pb{}.op(opPROTO, 4, opNONE), []byte{opEMPTY_DICT, opMARK, opBININT1, 1, opDUP, opSETITEMS, opPOP}, n, end...),
		"4096 views":         sharedTensors(4096, 1, []int64{1, 1, 1, 1}, []int64{1, 1, 1, 1}),
		"views of 64 dims":   sharedTensors(4096, 1, make([]int64, 64), make([]int64, 64)),
		"storage refs":       pb{}.op(opPROTO, 4, opEMPTY_LIST).stackGlobal("torch.storage", "_load_from_bytes").bytes(cpuBombContainer(600, 10)).op(opTUPLE1, opREDUCE, opPOP, opSTOP),
		"memoised container": cpuBomb(100),
	}
	sparse := pb{}.op(opPROTO, 4, opNONE)
	for i := 0; len(sparse) < n; i++ {
		sparse = sparse.op(opLONG_BINPUT, byte(i), byte(i>>8), byte(i>>16), 1)
	}
	cases["sparse memo"] = sparse.op(opPOP, opEMPTY_LIST, opSTOP)
	gaps := pb{}.op(opPROTO, 4, opNONE)
	for i := 0; len(gaps) < n; i++ {
		gaps = gaps.op(opLONG_BINPUT, byte(i*63), byte(i*63>>8), byte(i*63>>16), 0)
	}
	cases["memo with gaps"] = gaps.op(opPOP, opEMPTY_LIST, opSTOP)
	for name, b := range memoryBombs(n) {
		cases[name] = b
	}
	for name, data := range cases {
		_, u, alloc, err := decodeMeasured(data, tightLimits(len(data)))
		checkCost(t, data, u, alloc, fuzzTightAllocBase)
		t.Logf("%-18s %6d bytes, tight limits: %7d allocated (%.1fx), %6d steps, %5d items, %v", name, len(data), alloc, float64(alloc)/float64(len(data)), u.work, u.items, err)
		_, u, alloc, err = decodeMeasured(data, Limits{})
		checkCost(t, data, u, alloc, fuzzAllocBase)
		t.Logf("%-18s %6d bytes, default limits: %7d allocated (%.1fx), %6d steps, %5d items, %v", name, len(data), alloc, float64(alloc)/float64(len(data)), u.work, u.items, err)
	}
}
