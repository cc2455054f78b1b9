package torchpickle

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// torch2Dir holds pickles written by torch 2.6 (Debian trixie's python3-torch,
// through scripts/torch2-env.sh and testdata/gen_fixtures.py). They are
// committed, so these tests run without a torch 2 installation.
const torch2Dir = "testdata/fixtures-torch2.6"

// torch2PythonEnv names an interpreter with torch 2.x; `task test:torch2`
// sets it to the trixie root's /usr/bin/python3.
const torch2PythonEnv = "KVDOCK_TORCH2_PYTHON"

var updateTorch2Corpus = flag.Bool("update-torch2-corpus", false, "write testdata/fuzz/FuzzDecode/torch2_* seeds from "+torch2Dir)

type torch2Manifest struct {
	Torch    string    `json:"torch"`
	Fixtures []fixture `json:"fixtures"`
	Refused  []struct {
		Name  string `json:"name"`
		Error string `json:"error"`
	} `json:"refused"`
}

func loadTorch2Manifest(t *testing.T) torch2Manifest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(torch2Dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m torch2Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(m.Torch, "2.") || len(m.Fixtures) == 0 || len(m.Refused) == 0 {
		t.Fatalf("%s: torch %q, %d fixtures, %d refused: want torch 2.x fixtures of both kinds", torch2Dir, m.Torch, len(m.Fixtures), len(m.Refused))
	}
	return m
}

func readFixture(t *testing.T, dir, name, ext string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name+ext))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeTorch2Fixtures: every pickle torch 2.6 wrote decodes to the dtype,
// shape and bytes torch reported; contiguous tensors alias the input.
func TestDecodeTorch2Fixtures(t *testing.T) {
	m := loadTorch2Manifest(t)
	protos, seen := map[int]bool{}, map[string]bool{}
	v3 := 0
	for _, f := range m.Fixtures {
		protos[f.Protocol] = true
		for _, x := range f.Tensors {
			seen[x.Dtype] = true
		}
		pkl := readFixture(t, torch2Dir, f.Name, ".pkl")
		if bytes.Contains(pkl, []byte("_rebuild_tensor_v3")) {
			v3++
		}
		t.Run(f.Name, func(t *testing.T) {
			got, err := Decode(pkl, Limits{})
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			checkAgainstRaw(t, got, f.Tensors, readFixture(t, torch2Dir, f.Name, ".raw"))
			if f.Protocol >= 3 && isContiguousCase(f.Name) && !strings.HasPrefix(f.Name, "f8_transposed") && !strings.HasPrefix(f.Name, "f8_views") {
				for i, g := range got {
					if !within(g.Data, pkl) {
						t.Errorf("tensor %d: contiguous data was copied, want a slice of the input", i)
					}
				}
			}
		})
	}
	for p := 2; p <= 5; p++ {
		if !protos[p] {
			t.Errorf("no torch 2 fixture for protocol %d", p)
		}
	}
	for _, d := range dtypes {
		if !seen[d.name] {
			t.Errorf("no torch 2 fixture of dtype %s", d.name)
		}
	}
	if v3 == 0 {
		t.Error("no torch 2 fixture uses _rebuild_tensor_v3: the float8 form is untested")
	}
}

// TestDecodeTorch2Refused: what torch 2.6 writes for tensors that are not
// plain CPU tensors of a supported dtype (uint16, complex, Parameter, a tensor
// with Python attributes, conj metadata) is refused, naming the reason.
func TestDecodeTorch2Refused(t *testing.T) {
	for _, r := range loadTorch2Manifest(t).Refused {
		_, err := Decode(readFixture(t, torch2Dir, r.Name, ".pkl"), Limits{})
		if err == nil || !(errors.Is(err, ErrForbidden) || errors.Is(err, ErrMalformed)) {
			t.Errorf("%s: %v, want ErrForbidden or ErrMalformed", r.Name, err)
			continue
		}
		if !strings.Contains(err.Error(), r.Error) {
			t.Errorf("%s: error %q does not mention %q", r.Name, err, r.Error)
		}
	}
}

// TestEncodeFollowsTorch2Form: for each dtype form, Go's pickle references the
// same rebuild function, storage class and dtype global as torch 2.6's, so a
// torch 2.x worker loads it (TestInteropWithTorch2 checks that with torch).
// The one difference is deliberate: float8 storages are named
// torch.ByteStorage, not torch.storage.UntypedStorage, which torch 2.6's own
// loader fails on.
func TestEncodeFollowsTorch2Form(t *testing.T) {
	markers := func(d *dtypeInfo) []string {
		ms := []string{"_rebuild_tensor_v2", "_rebuild_tensor_v3"}
		if d.storage != "" {
			ms = append(ms, "torch\n"+d.storage+"\n")
		}
		// The dtype global's name, a SHORT_BINUNICODE before STACK_GLOBAL.
		return append(ms, "\x8c"+string([]byte{byte(len(d.name))})+d.name)
	}
	for _, name := range []string{"f8e4m3_4d_p4", "f8e5m2_mla_p4", "bf16_mla_p4", "f32_1d_p4", "bool_p4"} {
		pkl := readFixture(t, torch2Dir, name, ".pkl")
		ts, err := Decode(pkl, Limits{})
		if err != nil || len(ts) != 1 {
			t.Fatalf("%s: %v", name, err)
		}
		d, _ := dtypeByName(ts[0].Dtype)
		enc, err := AppendEncode(nil, ts)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, mk := range markers(d) {
			if torchHas, goHas := bytes.Contains(pkl, []byte(mk)), bytes.Contains(enc, []byte(mk)); torchHas != goHas {
				t.Errorf("%s (%s): torch 2.6's pickle contains %q: %v, Go's: %v", name, d.name, mk, torchHas, goHas)
			}
		}
		if untypedInTorch(d) != bytes.Contains(pkl, []byte("torch.storage\nUntypedStorage\n")) ||
			untypedInTorch(d) != bytes.Contains(enc, []byte("ctorch\nByteStorage\n")) {
			t.Errorf("%s (%s): float8 storages must be UntypedStorage in torch's pickle and ByteStorage in Go's", name, d.name)
		}
	}
}

// float8Cases are encode cases only torch 2.x can load.
func float8Cases() []encCase {
	r := rand.New(rand.NewPCG(7, 8))
	return []encCase{
		{"float8_e4m3fn_4d", []Tensor{randTensor(r, "float8_e4m3fn", 2, 2, 16, 16)}},
		{"float8_e5m2_mla", []Tensor{randTensor(r, "float8_e5m2", 2, 16, 16)}},
		{"float8_scalar_empty", []Tensor{randTensor(r, "float8_e4m3fn"), randTensor(r, "float8_e5m2", 0, 3)}},
		// v3 first, then v2, then v3 again: the memo indices of both forms interleave.
		{"mixed_v3_v2", []Tensor{randTensor(r, "float8_e4m3fn", 4, 8), randTensor(r, "bfloat16", 4, 8),
			randTensor(r, "float8_e5m2", 3), randTensor(r, "float8_e4m3fn", 2), randTensor(r, "float16", 5)}},
		{"large_float8", []Tensor{randTensor(r, "float8_e5m2", 70000)}},
	}
}

// v3Pickle builds [_rebuild_tensor_v3(_load_from_bytes(cont), offset, size,
// stride, False, OrderedDict(), <dtypeMod>.<dtypeName>)] at protocol 4.
func v3Pickle(cont []byte, offset int64, size, stride []int64, dtypeMod, dtypeName string) []byte {
	p := rebuildArgs("_rebuild_tensor_v3", cont, offset, size, stride)
	return p.stackGlobal(dtypeMod, dtypeName).op(opTUPLE, opREDUCE, opAPPEND, opSTOP)
}

// containerOf is a legacy container whose persistent id names mod.class.
func containerOf(mod, class string, count uint64, data []byte) []byte {
	p := pb{}.op(opPROTO, 2, opLONG1, 10).op(legacyMagic[:]...).op(opSTOP).
		op(opPROTO, 2, opBININT2, 0xe9, 0x03, opSTOP).op([]byte(legacySysInfo)...).
		op(opPROTO, 2, opMARK).uni("storage").global(mod, class).uni("k").uni("cpu")
	p = binary.LittleEndian.AppendUint64(p.op(opLONG1, 8), count)
	p = p.op(opNONE, opTUPLE, opBINPERSID, opSTOP).op(opPROTO, 2, opEMPTY_LIST).uni("k").op(opAPPEND, opSTOP)
	return append(binary.LittleEndian.AppendUint64(p, count), data...)
}

// TestTorch2FormsMisused: the torch 2.x globals are accepted only in the
// places torch writes them, with the same bounds as the torch 1.13 form.
func TestTorch2FormsMisused(t *testing.T) {
	data := make([]byte, 64)
	for i := range data {
		data[i] = byte(i)
	}
	untyped := containerOf("torch.storage", "UntypedStorage", 64, data)
	ok := v3Pickle(untyped, 2, []int64{4, 8}, []int64{8, 1}, "torch", "float8_e5m2")
	ts, err := Decode(ok, Limits{})
	if err != nil || len(ts) != 1 || ts[0].Dtype != "float8_e5m2" || !bytes.Equal(ts[0].Data, data[2:34]) {
		t.Fatalf("control pickle: %v %+v", err, ts)
	}
	// A 2-byte dtype over untyped bytes: offset and strides count elements.
	if ts, err := Decode(v3Pickle(untyped, 1, []int64{2}, []int64{3}, "torch", "bfloat16"), Limits{}); err != nil ||
		!bytes.Equal(ts[0].Data, []byte{2, 3, 8, 9}) {
		t.Fatalf("bfloat16 over an UntypedStorage: %v %+v", err, ts)
	}
	// The form the encoder writes: v3 over a ByteStorage.
	if ts, err := Decode(v3Pickle(containerOf("torch", "ByteStorage", 64, data), 4, []int64{2}, []int64{1}, "torch", "float8_e4m3fn"), Limits{}); err != nil ||
		ts[0].Dtype != "float8_e4m3fn" || !bytes.Equal(ts[0].Data, []byte{4, 5}) {
		t.Fatalf("float8 over a ByteStorage: %v %+v", err, ts)
	}
	typed := containerOf("torch", "FloatStorage", 16, data)
	// A container whose saved object calls UntypedStorage instead of naming it in a persistent id.
	callInContainer := pb{}.op(opPROTO, 2, opLONG1, 10).op(legacyMagic[:]...).op(opSTOP).
		op(opPROTO, 2, opBININT2, 0xe9, 0x03, opSTOP).op([]byte(legacySysInfo)...).
		op(opPROTO, 2).global("torch.storage", "UntypedStorage").op(opEMPTY_TUPLE, opREDUCE, opSTOP)
	cases := []struct {
		name string
		data []byte
		kind error
		msg  string
	}{
		{"v2 over an UntypedStorage", tensorPickle(untyped, 0, []int64{4}, []int64{1}), ErrMalformed, "want a typed storage"},
		{"v3 over a typed storage", v3Pickle(typed, 0, []int64{4}, []int64{1}, "torch", "float8_e4m3fn"), ErrMalformed, "want an UntypedStorage or a ByteStorage"},
		{"v3 with a str for dtype", bytes.Replace(ok, []byte("\x8c\x05torch\x8c\x0bfloat8_e5m2\x93"), []byte("\x8c\x0bfloat8_e5m2"), 1), ErrMalformed, "want a torch dtype"},
		{"unsupported dtype global", v3Pickle(untyped, 0, []int64{4}, []int64{1}, "torch", "uint16"), ErrForbidden, "global torch.uint16 not allowed"},
		{"dtype global from another module", v3Pickle(untyped, 0, []int64{4}, []int64{1}, "numpy", "float32"), ErrForbidden, "global numpy.float32 not allowed"},
		{"element count not whole", v3Pickle(containerOf("torch.storage", "UntypedStorage", 63, data[:63]), 0, []int64{4}, []int64{1}, "torch", "float32"), ErrMalformed, "not whole"},
		{"view beyond the untyped bytes", v3Pickle(untyped, 0, []int64{17}, []int64{1}, "torch", "float32"), ErrMalformed, "reaches element"},
		{"huge expanded view", v3Pickle(untyped, 0, []int64{1 << 40}, []int64{0}, "torch", "float8_e4m3fn"), ErrLimit, ""},
		{"declared bytes absent", v3Pickle(containerOf("torch.storage", "UntypedStorage", 1<<60, data), 0, []int64{4}, []int64{1}, "torch", "float8_e4m3fn"), ErrMalformed, ""},
		{"dtype called", pb{}.op(opPROTO, 4).stackGlobal("torch", "float8_e4m3fn").op(opEMPTY_TUPLE, opREDUCE, opSTOP), ErrForbidden, "REDUCE on torch.float8_e4m3fn"},
		{"UntypedStorage outside a container", pb{}.op(opPROTO, 4).stackGlobal("torch.storage", "UntypedStorage").op(opEMPTY_TUPLE, opREDUCE, opSTOP), ErrForbidden, "global torch.storage.UntypedStorage not allowed"},
		{"UntypedStorage called inside a container", pb{}.op(opPROTO, 4).stackGlobal("torch.storage", "_load_from_bytes").
			bytes(callInContainer).op(opTUPLE1, opREDUCE, opSTOP), ErrForbidden, "REDUCE on torch.UntypedStorage"},
		{"rebuild_v3 inside a container", tensorPickle(containerOf("torch._utils", "_rebuild_tensor_v3", 4, data[:4]), 0, []int64{4}, []int64{1}), ErrForbidden, "not allowed in a storage container"},
		{"dtype global inside a container", tensorPickle(containerOf("torch", "float8_e4m3fn", 4, data[:4]), 0, []int64{4}, []int64{1}), ErrForbidden, "not allowed in a storage container"},
		{"float8 typed storage name torch never wrote", tensorPickle(containerOf("torch", "Float8_e4m3fnStorage", 4, data[:4]), 0, []int64{4}, []int64{1}), ErrForbidden, "global torch.Float8_e4m3fnStorage not allowed"},
		{"empty storage class name", tensorPickle(containerOf("torch", "", 4, data[:4]), 0, []int64{4}, []int64{1}), ErrForbidden, "not allowed in a storage container"},
		{"v3 with 9 arguments", bytes.Replace(ok, []byte{opTUPLE, opREDUCE, opAPPEND}, []byte{opNONE, opNONE, opTUPLE, opREDUCE, opAPPEND}, 1), ErrMalformed, "want 7 or 8"},
	}
	for _, c := range cases {
		_, err := Decode(c.data, Limits{})
		if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want %v mentioning %q", c.name, err, c.kind, c.msg)
		}
	}
}

// TestTorch2FuzzSeeds keeps a FuzzDecode seed per torch 2 fixture in the
// committed corpus (go test -run TestTorch2FuzzSeeds -update-torch2-corpus).
func TestTorch2FuzzSeeds(t *testing.T) {
	fs, err := filepath.Glob(filepath.Join(torch2Dir, "*.pkl"))
	if err != nil || len(fs) == 0 {
		t.Fatalf("no torch 2 fixtures (%v)", err)
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	for _, f := range fs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		want := []byte("go test fuzz v1\n[]byte(" + strconv.Quote(string(b)) + ")\n")
		seed := filepath.Join(dir, "torch2_"+strings.TrimSuffix(filepath.Base(f), ".pkl"))
		if *updateTorch2Corpus {
			writeFile(t, seed, want)
		}
		got, err := os.ReadFile(seed)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("seed %s missing or out of date (run go test -run TestTorch2FuzzSeeds -update-torch2-corpus): %v", seed, err)
		}
	}
}
