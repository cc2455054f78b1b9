package layout

import (
	"strings"
	"testing"
)

// TestNewGroup: a group's chunk holds the whole blocks that fit in the
// server chunk; tokens_per_block falls back to block_size; a block larger
// than the chunk, no block size and an overflowing size are refused.
func TestNewGroup(t *testing.T) {
	l, err := NewGroup(Group{BlockSize: 4, NumLayers: 3, HiddenDimSize: 8, DtypeStr: "float32", TokensPerBlock: 6}, 16)
	if err != nil || l.Shape[2] != 12 || l.Bytes != 2*3*12*8*4 {
		t.Fatalf("tpb 6 in a 16-token chunk: %+v %v", l, err)
	}
	l, err = NewGroup(Group{BlockSize: 8, NumLayers: 1, HiddenDimSize: 4, DtypeStr: "float16", UseMLA: true}, 16)
	if err != nil || len(l.Shape) != 3 || l.Shape[1] != 16 {
		t.Fatalf("MLA, block size as tpb: %+v %v", l, err)
	}
	for name, g := range map[string]Group{
		"no block":       {NumLayers: 1, HiddenDimSize: 4, DtypeStr: "float16"},
		"block > chunk":  {BlockSize: 32, NumLayers: 1, HiddenDimSize: 4, DtypeStr: "float16"},
		"overflow":       {BlockSize: 4, NumLayers: 1 << 30, HiddenDimSize: 1 << 30, DtypeStr: "float16"},
		"unknown dtype":  {BlockSize: 4, NumLayers: 1, HiddenDimSize: 4, DtypeStr: "complex32"},
		"negative layer": {BlockSize: 4, NumLayers: -1, HiddenDimSize: 4, DtypeStr: "float16"},
	} {
		if _, err := NewGroup(g, 16); err == nil || !strings.Contains(err.Error(), "invalid") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestRegistryGroups: a model's groups are kept, counted and returned in
// order; the largest group sets MaxBytes; the last reference removes them.
func TestRegistryGroups(t *testing.T) {
	a, _ := New(2, 16, 4, "float16", false)
	b, _ := New(1, 16, 64, "float32", false)
	r := NewRegistry()
	r.AddGroups("m", 1, []Layout{a, b})
	r.Add("p", 1, a)
	if r.GroupCount("m", 1) != 2 || r.GroupCount("p", 1) != 1 || r.GroupCount("x", 1) != 0 {
		t.Fatal("group counts")
	}
	if g, ok := r.GroupLayout("m", 1, 1); !ok || !g.Equal(b) {
		t.Fatalf("group 1 = %v", g)
	}
	if _, ok := r.GroupLayout("m", 1, 2); ok {
		t.Fatal("group 2 of a 2-group model")
	}
	if g, _ := r.Get("m", 1); !g.Equal(a) {
		t.Fatal("Get is not group 0")
	}
	if r.MaxBytes() != b.Bytes {
		t.Fatalf("MaxBytes = %d, want group 1's %d", r.MaxBytes(), b.Bytes)
	}
	gs, _ := r.Groups("m", 1)
	gs[1].Shape[0] = 99 // a copy
	if g, _ := r.GroupLayout("m", 1, 1); g.Shape[0] == 99 {
		t.Fatal("Groups shares the registry's shapes")
	}
	if !GroupsEqual([]Layout{a, b}, []Layout{a, b}) || GroupsEqual([]Layout{a, b}, []Layout{b, a}) || GroupsEqual([]Layout{a}, []Layout{a, b}) {
		t.Fatal("GroupsEqual")
	}
	r.Remove("m", 1, ID([]Layout{a, b}))
	if r.GroupCount("m", 1) != 0 || r.MaxBytes() != a.Bytes {
		t.Fatalf("after remove: %d groups, MaxBytes %d", r.GroupCount("m", 1), r.MaxBytes())
	}
}
