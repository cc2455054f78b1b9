package torchpickle

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type encCase struct {
	name    string
	tensors []Tensor
}

// randTensor fills a tensor with seeded bytes (bool gets 0/1 only).
func randTensor(r *rand.Rand, dtype string, shape ...int) Tensor {
	es, err := ElementSize(dtype)
	if err != nil {
		panic(err)
	}
	n := es
	for _, d := range shape {
		n *= d
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.IntN(256))
		if dtype == "bool" {
			b[i] &= 1
		}
	}
	return Tensor{Dtype: dtype, Shape: shape, Data: b}
}

func encodeCases() []encCase {
	r := rand.New(rand.NewPCG(1, 2))
	var cs []encCase
	for _, dt := range []string{"float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"} {
		cs = append(cs, encCase{dt + "_4d", []Tensor{randTensor(r, dt, 2, 2, 16, 16)}})
	}
	cs = append(cs,
		encCase{"mla", []Tensor{randTensor(r, "bfloat16", 2, 16, 16)}},
		encCase{"several", []Tensor{randTensor(r, "bfloat16", 2, 2, 8, 4), randTensor(r, "bfloat16", 2, 2, 8, 4), randTensor(r, "float16", 3), randTensor(r, "uint8", 300, 300)}},
		encCase{"scalar", []Tensor{randTensor(r, "float32")}},
		encCase{"empty_tensor", []Tensor{randTensor(r, "float16", 0, 5)}},
		encCase{"empty_list", nil},
		encCase{"large_dims", []Tensor{randTensor(r, "int8", 70000)}}, // BININT for size, > 64 KiB bytes
	)
	// More tensors than one APPENDS batch: the list is built in batches.
	// (512 bytes each: much smaller tensors, thousands of them, exceed the
	// decoder's default item budget, see Limits.MaxItems.)
	many := make([]Tensor, 2001)
	for i := range many {
		many[i] = randTensor(r, "float16", 2, 128)
	}
	cs = append(cs, encCase{"batched", many})
	return cs
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	cases := append(encodeCases(), encCase{"float8", []Tensor{
		randTensor(rand.New(rand.NewPCG(3, 4)), "float8_e4m3fn", 4, 4), randTensor(rand.New(rand.NewPCG(5, 6)), "float8_e5m2", 3)}})
	for _, c := range cases {
		prefix := []byte("prefix")
		size := EncodedSize(c.tensors)
		out, err := AppendEncode(prefix, c.tensors)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !bytes.Equal(out[:6], []byte("prefix")) || len(out)-6 != size {
			t.Fatalf("%s: appended %d bytes, EncodedSize %d (or prefix lost)", c.name, len(out)-6, size)
		}
		got, err := Decode(out[6:], Limits{})
		if err != nil {
			t.Fatalf("%s: Decode(AppendEncode): %v", c.name, err)
		}
		if len(got) != len(c.tensors) {
			t.Fatalf("%s: %d tensors back, want %d", c.name, len(got), len(c.tensors))
		}
		for i, w := range c.tensors {
			g := got[i]
			if g.Dtype != w.Dtype || !slices.Equal(g.Shape, w.Shape) || !bytes.Equal(g.Data, w.Data) {
				t.Errorf("%s[%d]: got %s %v, want %s %v (or data differs)", c.name, i, g.Dtype, g.Shape, w.Dtype, w.Shape)
			}
			if !within(g.Data, out) {
				t.Errorf("%s[%d]: decoded data copied", c.name, i)
			}
		}
	}
}

func TestEncodeAllocatesOnce(t *testing.T) {
	ts := encodeCases()[0].tensors
	dst := make([]byte, 0, EncodedSize(ts))
	allocs := testing.AllocsPerRun(10, func() {
		if _, err := AppendEncode(dst, ts); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("AppendEncode into a presized buffer allocated %v times", allocs)
	}
}

func TestEncodeRejectsBadTensors(t *testing.T) {
	cases := map[string]Tensor{
		"dtype":    {Dtype: "complex64", Shape: []int{1}, Data: make([]byte, 8)},
		"length":   {Dtype: "float32", Shape: []int{2, 2}, Data: make([]byte, 15)},
		"negative": {Dtype: "int8", Shape: []int{-1}, Data: nil},
		"overflow": {Dtype: "int8", Shape: []int{1 << 40, 1 << 40}, Data: nil},
	}
	for name, tc := range cases {
		out, err := AppendEncode([]byte("x"), []Tensor{tc})
		if !errors.Is(err, ErrInvalidTensor) || string(out) != "x" {
			t.Errorf("%s: %v (dst %q), want ErrInvalidTensor and dst unchanged", name, err, out)
		}
		if EncodedSize([]Tensor{tc}) != -1 {
			t.Errorf("%s: EncodedSize not -1", name)
		}
	}
}

// TestInteropWithInstalledTorch runs the real torch: it loads Go's pickles and
// checks them against the raw bytes, and it produces fresh pickles that Go decodes.
func TestInteropWithInstalledTorch(t *testing.T) {
	runInterop(t, pythonPath, encodeCases())
}

// runInterop has python (an interpreter with torch) load Go's encoding of
// cases and compare it with the raw bytes (testdata/interop.py), then decodes
// the pickles that torch wrote in turn.
func runInterop(t *testing.T, python string, cases []encCase) {
	dir := t.TempDir()
	var manifest []fixture
	for _, c := range cases {
		out, err := AppendEncode(nil, c.tensors)
		if err != nil {
			t.Fatal(err)
		}
		var raw []byte
		f := fixture{Name: "go_" + c.name, Protocol: 4}
		for _, ts := range c.tensors {
			raw = append(raw, ts.Data...)
			f.Tensors = append(f.Tensors, manifestTensor{Dtype: ts.Dtype, Shape: append([]int{}, ts.Shape...)})
		}
		if f.Tensors == nil {
			f.Tensors = []manifestTensor{}
		}
		manifest = append(manifest, f)
		writeFile(t, filepath.Join(dir, f.Name+".pkl"), out)
		writeFile(t, filepath.Join(dir, f.Name+".raw"), raw)
	}
	mb, err := json.Marshal(manifest)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "go_manifest.json"), mb)

	cmd := exec.Command(python, filepath.Join("testdata", "interop.py"), dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python interop: %v\n%s", err, out)
	}
	if got := strings.Count(string(out), "ok go_"); got != len(manifest) {
		t.Fatalf("python checked %d Go pickles, want %d:\n%s", got, len(manifest), out)
	}

	fs := loadManifest(t, filepath.Join(dir, "py_manifest.json"))
	for _, f := range fs {
		pkl, err := os.ReadFile(filepath.Join(dir, f.Name+".pkl"))
		if err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(filepath.Join(dir, f.Name+".raw"))
		if err != nil {
			t.Fatal(err)
		}
		t.Run(f.Name, func(t *testing.T) {
			got, err := Decode(pkl, Limits{})
			if err != nil {
				t.Fatalf("Decode of torch's protocol-%d pickle: %v", f.Protocol, err)
			}
			checkAgainstRaw(t, got, f.Tensors, raw)
		})
	}
}

func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
