package torchpickle

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"
)

func groupCases() [][]Tensor {
	a := Tensor{Dtype: "float16", Shape: []int{2, 3}, Data: bytes.Repeat([]byte{1, 2}, 6)}
	b := Tensor{Dtype: "float32", Shape: []int{4}, Data: bytes.Repeat([]byte{9, 8, 7, 6}, 4)}
	c := Tensor{Dtype: "bfloat16", Shape: []int{1, 2, 2}, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8}}
	return [][]Tensor{{a, c}, {}, {b}}
}

// TestEncodeGroupsRoundTrip: AppendEncodeGroups writes exactly
// EncodedGroupsSize bytes, and DecodeGroups gives back every group, in
// order, with the same tensors (an empty group stays empty).
func TestEncodeGroupsRoundTrip(t *testing.T) {
	for _, groups := range [][][]Tensor{groupCases(), {}, {{}}} {
		out, err := AppendEncodeGroups(nil, groups)
		if err != nil {
			t.Fatal(err)
		}
		if n := EncodedGroupsSize(groups); n != len(out) {
			t.Fatalf("size %d, wrote %d", n, len(out))
		}
		got, err := DecodeGroups(out, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(groups) {
			t.Fatalf("%d groups, want %d", len(got), len(groups))
		}
		for g := range groups {
			if len(got[g]) != len(groups[g]) {
				t.Fatalf("group %d: %d tensors, want %d", g, len(got[g]), len(groups[g]))
			}
			for i, w := range groups[g] {
				h := got[g][i]
				if h.Dtype != w.Dtype || !bytes.Equal(h.Data, w.Data) || len(h.Shape) != len(w.Shape) {
					t.Errorf("group %d tensor %d: %+v, want %+v", g, i, h, w)
				}
			}
		}
	}
	// A flat list is not a group list, and a group list is not a flat list.
	flat, _ := AppendEncode(nil, groupCases()[0])
	if _, err := DecodeGroups(flat, Limits{}); !errors.Is(err, ErrMalformed) {
		t.Errorf("flat list as groups: %v", err)
	}
	nested, _ := AppendEncodeGroups(nil, groupCases())
	if _, err := Decode(nested, Limits{}); !errors.Is(err, ErrMalformed) {
		t.Errorf("groups as a flat list: %v", err)
	}
}

// pyPickle runs a Python snippet (with torch imported) that prints a
// pickle's bytes as hex.
func pyPickle(t *testing.T, body string) []byte {
	t.Helper()
	src := "import pickle, sys, torch\n" + body + "\nsys.stdout.write(blob.hex())\n"
	out, err := exec.Command(pythonPath, "-c", src).Output()
	if err != nil {
		t.Fatalf("python: %v", err)
	}
	b := make([]byte, len(out)/2)
	for i := range b {
		var v byte
		for _, c := range out[2*i : 2*i+2] {
			v <<= 4
			switch {
			case c >= '0' && c <= '9':
				v |= c - '0'
			default:
				v |= c - 'a' + 10
			}
		}
		b[i] = v
	}
	return b
}

// TestDecodeGroupsFromTorch reads what LMCache's multi-group serializer
// writes with the installed torch: ("tensor", t) pairs at the highest
// pickle protocol, and bare tensors; hostile and unsupported shapes are
// refused with an error that names them.
func TestDecodeGroupsFromTorch(t *testing.T) {
	blob := pyPickle(t, `g0 = [torch.arange(24, dtype=torch.float16).reshape(2, 3, 4), torch.ones(2, 3, 4, dtype=torch.float16)]
g1 = [torch.arange(6, dtype=torch.float32).reshape(1, 2, 3)]
blob = pickle.dumps([[("tensor", x.contiguous()) for x in g] for g in (g0, g1)], protocol=pickle.HIGHEST_PROTOCOL)`)
	got, err := DecodeGroups(blob, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || len(got[0]) != 2 || len(got[1]) != 1 {
		t.Fatalf("shape of groups: %d", len(got))
	}
	if got[1][0].Dtype != "float32" || len(got[1][0].Data) != 24 || got[0][0].Shape[2] != 4 {
		t.Errorf("tensors: %+v %+v", got[0][0].Shape, got[1][0])
	}
	bare := pyPickle(t, `blob = pickle.dumps([[torch.zeros(2)], []])`)
	if got, err := DecodeGroups(bare, Limits{}); err != nil || len(got) != 2 || len(got[0]) != 1 || len(got[1]) != 0 {
		t.Errorf("bare tensors: %v %v", got, err)
	}
	for name, src := range map[string]string{
		"wrong tag":      `blob = pickle.dumps([[("fp8", torch.zeros(2))]])`,
		"three items":    `blob = pickle.dumps([[("tensor", torch.zeros(2), "x")]])`,
		"group not list": `blob = pickle.dumps([torch.zeros(2)])`,
		"int item":       `blob = pickle.dumps([[5]])`,
		"top not list":   `blob = pickle.dumps(([[torch.zeros(2)]],))`,
	} {
		_, err := DecodeGroups(pyPickle(t, src), Limits{})
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if name == "wrong tag" && !strings.Contains(err.Error(), "fp8") {
			t.Errorf("%s: error does not name the tag: %v", name, err)
		}
	}
}

// TestDecodeGroupsShared: groups that are all one memoised list are
// counted as the tensors they would expand to, so a small pickle cannot
// make a huge result.
func TestDecodeGroupsShared(t *testing.T) {
	blob := pyPickle(t, `g = [torch.zeros(1) for _ in range(100)]
blob = pickle.dumps([g] * 100, protocol=4)`)
	if _, err := DecodeGroups(blob, Limits{MaxTensors: 1000}); !errors.Is(err, ErrLimit) {
		t.Errorf("100 × 100 shared tensors under a 1000 limit: %v", err)
	}
	if got, err := DecodeGroups(blob, Limits{MaxTensors: 10000}); err != nil || len(got) != 100 {
		t.Errorf("within the limit: %d %v", len(got), err)
	}
}
