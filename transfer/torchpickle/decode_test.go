package torchpickle

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"
)

type manifestTensor struct {
	Dtype string `json:"dtype"`
	Shape []int  `json:"shape"`
}

type fixture struct {
	Name     string           `json:"name"`
	Protocol int              `json:"protocol"`
	Tensors  []manifestTensor `json:"tensors"`
}

func loadManifest(t testing.TB, path string) []fixture {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Fixtures []fixture `json:"fixtures"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Fixtures) == 0 {
		t.Fatal("empty manifest")
	}
	return m.Fixtures
}

// checkAgainstRaw compares decoded tensors with the manifest and the raw sidecar.
func checkAgainstRaw(t *testing.T, got []Tensor, want []manifestTensor, raw []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("decoded %d tensors, want %d", len(got), len(want))
	}
	off := 0
	for i, w := range want {
		g := got[i]
		if g.Dtype != w.Dtype {
			t.Errorf("tensor %d dtype %q, want %q", i, g.Dtype, w.Dtype)
		}
		if len(g.Shape) != len(w.Shape) {
			t.Fatalf("tensor %d shape %v, want %v", i, g.Shape, w.Shape)
		}
		n := 1
		for j := range w.Shape {
			if g.Shape[j] != w.Shape[j] {
				t.Errorf("tensor %d shape %v, want %v", i, g.Shape, w.Shape)
			}
			n *= w.Shape[j]
		}
		es, err := ElementSize(w.Dtype)
		if err != nil {
			t.Fatal(err)
		}
		n *= es
		if off+n > len(raw) {
			t.Fatalf("raw sidecar too short")
		}
		if !bytes.Equal(g.Data, raw[off:off+n]) {
			t.Errorf("tensor %d (%s %v): data differs from torch's contiguous bytes", i, w.Dtype, w.Shape)
		}
		off += n
	}
	if off != len(raw) {
		t.Errorf("raw sidecar has %d extra bytes", len(raw)-off)
	}
}

// within reports whether b lies inside buf's memory (a zero-copy slice).
func within(b, buf []byte) bool {
	if len(b) == 0 || len(buf) == 0 {
		return true
	}
	p, lo := uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&buf[0]))
	return p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(buf))
}

func TestDecodeFixtures(t *testing.T) {
	dir := filepath.Join("testdata", "fixtures")
	fs := loadManifest(t, filepath.Join(dir, "manifest.json"))
	protos := map[int]bool{}
	for _, f := range fs {
		protos[f.Protocol] = true
		t.Run(f.Name, func(t *testing.T) {
			pkl, err := os.ReadFile(filepath.Join(dir, f.Name+".pkl"))
			if err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(filepath.Join(dir, f.Name+".raw"))
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(pkl, Limits{})
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			checkAgainstRaw(t, got, f.Tensors, raw)
			// Protocols 3+ carry bytes verbatim: contiguous tensors must alias the input.
			if f.Protocol >= 3 {
				for i, g := range got {
					if isContiguousCase(f.Name) && !within(g.Data, pkl) {
						t.Errorf("tensor %d: contiguous data was copied, want a slice of the input", i)
					}
				}
			}
		})
	}
	for p := 2; p <= 5; p++ {
		if !protos[p] {
			t.Errorf("no fixture for protocol %d", p)
		}
	}
}

func isContiguousCase(name string) bool {
	for _, p := range []string{"transposed", "expanded", "strided_step", "shared_storage"} {
		if len(name) >= len(p) && name[:len(p)] == p {
			return false
		}
	}
	return true
}

func TestDecodeSharedStorage(t *testing.T) {
	pkl, err := os.ReadFile(filepath.Join("testdata", "fixtures", "shared_storage_p4.pkl"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(pkl, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	// shared[0], shared[1:3] and shared are contiguous views: zero copy; shared.t() is copied.
	for _, i := range []int{0, 1, 3} {
		if !within(got[i].Data, pkl) {
			t.Errorf("tensor %d copied, want a slice of the input", i)
		}
	}
	if within(got[2].Data, pkl) {
		t.Errorf("transposed tensor aliases the input, want a contiguous copy")
	}
}

func TestDecodeRejectsCopyBeyondBudget(t *testing.T) {
	pkl, err := os.ReadFile(filepath.Join("testdata", "fixtures", "transposed_p4.pkl"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Decode(pkl, Limits{MaxCopyBytes: 16})
	if !errors.Is(err, ErrLimit) {
		t.Fatalf("Decode with a 16-byte copy budget: %v, want ErrLimit", err)
	}
	if _, err := Decode(pkl, Limits{}); err != nil {
		t.Fatalf("Decode with default limits: %v", err)
	}
}

func TestDecodeMaxTensors(t *testing.T) {
	pkl, err := os.ReadFile(filepath.Join("testdata", "fixtures", "several_p4.pkl"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(pkl, Limits{MaxTensors: 3}); !errors.Is(err, ErrLimit) {
		t.Fatalf("4 tensors with MaxTensors 3: %v, want ErrLimit", err)
	}
	if _, err := Decode(pkl, Limits{MaxTensors: 4}); err != nil {
		t.Fatalf("4 tensors with MaxTensors 4: %v", err)
	}
}

func TestDecodeTruncatedFixtures(t *testing.T) {
	pkl, err := os.ReadFile(filepath.Join("testdata", "fixtures", "several_p2.pkl"))
	if err != nil {
		t.Fatal(err)
	}
	pkl4, err := os.ReadFile(filepath.Join("testdata", "fixtures", "several_p5.pkl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range [][]byte{pkl, pkl4} {
		for n := 0; n < len(p); n++ {
			if _, err := Decode(p[:n], Limits{}); err == nil {
				t.Fatalf("prefix of %d/%d bytes decoded without error", n, len(p))
			}
		}
		if _, err := Decode(append(p[:len(p):len(p)], 0), Limits{}); !errors.Is(err, ErrMalformed) {
			t.Fatalf("trailing byte: %v, want ErrMalformed", err)
		}
	}
}

// TestDecodeMemoizedStorage: two tensors referring to one storage object via
// the memo (what pickle emits when one storage object is shared) decode as
// two views of the same bytes.
func TestDecodeMemoizedStorage(t *testing.T) {
	data := make([]byte, 24)
	for i := range data {
		data[i] = byte(i)
	}
	cont := container("FloatStorage", 6, 6, data)
	p := pb{}.op(opPROTO, 4, opEMPTY_LIST, opMARK).
		stackGlobal("torch._utils", "_rebuild_tensor_v2").op(opMEMOIZE, opMARK).                        // memo 0
		stackGlobal("torch.storage", "_load_from_bytes").bytes(cont).op(opTUPLE1, opREDUCE, opMEMOIZE). // memo 1: storage
		op(opBININT1, 0, opBININT1, 2, opBININT1, 3, opTUPLE2, opBININT1, 3, opBININT1, 1, opTUPLE2, opNEWFALSE).
		stackGlobal("collections", "OrderedDict").op(opMEMOIZE, opEMPTY_TUPLE, opREDUCE, opTUPLE, opREDUCE). // memo 2
		op(opBINGET, 0, opMARK, opBINGET, 1, opBININT1, 0, opBININT1, 3, opBININT1, 2, opTUPLE2, opBININT1, 1, opBININT1, 3, opTUPLE2, opNEWFALSE).
		op(opBINGET, 2, opEMPTY_TUPLE, opREDUCE, opTUPLE, opREDUCE, opAPPENDS, opSTOP)
	got, err := Decode(p, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !bytes.Equal(got[0].Data, data) {
		t.Fatalf("first view wrong: %+v", got)
	}
	// Second: the transpose of the first, shape [3,2], stride [1,3]: copied.
	if !slices.Equal(got[1].Shape, []int{3, 2}) {
		t.Fatalf("second shape %v", got[1].Shape)
	}
	var exp []byte
	for i := 0; i < 3; i++ {
		for j := 0; j < 2; j++ {
			e := i + j*3
			exp = append(exp, data[e*4:e*4+4]...)
		}
	}
	if !bytes.Equal(got[1].Data, exp) {
		t.Fatalf("second view data %v, want %v", got[1].Data, exp)
	}
}
