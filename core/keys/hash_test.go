package keys

import (
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zeebo/blake3"
)

var update = flag.Bool("update", false, "rewrite testdata/blake3_chain.json from the Hasher")

// refChain is an independent computation of the chained hash: it builds the
// message with explicit shifts and hashes it through the streaming API,
// sharing no code with Hasher.
func refChain(t *testing.T, chunkSize int, tokens []uint32) [][32]byte {
	t.Helper()
	prev := make([]byte, 12) // the none hash input: int 0 as 8 bytes, token 0 as 4 bytes
	h := blake3.New()
	h.Write(prev)
	cur := h.Sum(nil)
	var out [][32]byte
	for c := 0; (c+1)*chunkSize <= len(tokens); c++ {
		msg := append([]byte(nil), cur...)
		for _, tok := range tokens[c*chunkSize : (c+1)*chunkSize] {
			msg = append(msg, byte(tok>>24), byte(tok>>16), byte(tok>>8), byte(tok))
		}
		h.Reset()
		h.Write(msg)
		cur = h.Sum(nil)
		var d [32]byte
		copy(d[:], cur)
		out = append(out, d)
	}
	return out
}

func mustHasher(t testing.TB, cs int) *Hasher {
	t.Helper()
	h, err := NewHasher(cs, "blake3")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func seqTokens(n int, seed uint32) []uint32 {
	ts := make([]uint32, n)
	x := seed*2654435761 + 1
	for i := range ts {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		ts[i] = x
	}
	return ts
}

func TestBLAKE3IsTheRealOne(t *testing.T) {
	// Official BLAKE3 test vector for the empty input.
	got := blake3.Sum256(nil)
	if hex.EncodeToString(got[:]) != "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262" {
		t.Fatalf("blake3(\"\") = %x", got)
	}
}

func TestNoneHash(t *testing.T) {
	want := blake3.Sum256(make([]byte, 12))
	if NoneHash() != Hash(want) {
		t.Fatalf("NoneHash = %x, want blake3(12 zero bytes) %x", NoneHash(), want)
	}
	if NoneHash() == Hash(blake3.Sum256([]byte("None"))) {
		t.Fatal("NoneHash must not be the C++ port's BLAKE3(\"None\")")
	}
}

func TestHashesMatchIndependentComputation(t *testing.T) {
	for _, cs := range []int{1, 4, 16, 256} {
		h := mustHasher(t, cs)
		for _, n := range []int{0, cs - 1, cs, 3*cs + 1, 8 * cs} {
			tokens := seqTokens(n, uint32(cs*1000+n))
			if n > 0 {
				tokens[0] = 0xFFFFFFFF // high bit set: must pack as unsigned
			}
			got := h.Hashes(tokens)
			want := refChain(t, cs, tokens)
			if len(got) != len(want) || len(got) != n/cs {
				t.Fatalf("cs=%d n=%d: %d hashes, want %d", cs, n, len(got), n/cs)
			}
			for i := range got {
				if got[i] != Hash(want[i]) {
					t.Fatalf("cs=%d n=%d chunk %d: %x, want %x", cs, n, i, got[i], want[i])
				}
			}
		}
	}
}

func TestHashesKnownFirstChunk(t *testing.T) {
	// Chunk of tokens 1,2 with chunk size 2: BLAKE3(none || 00000001 00000002).
	h := mustHasher(t, 2)
	none := blake3.Sum256(make([]byte, 12))
	msg := append(none[:], 0, 0, 0, 1, 0, 0, 0, 2)
	want := blake3.Sum256(msg)
	got := h.Hashes([]uint32{1, 2, 3})
	if len(got) != 1 || got[0] != Hash(want) {
		t.Fatalf("got %x, want [%x]", got, want)
	}
}

func TestHashesOnlyFullChunks(t *testing.T) {
	h := mustHasher(t, 4)
	tokens := seqTokens(11, 7)
	got := h.Hashes(tokens)
	if len(got) != 2 {
		t.Fatalf("11 tokens at chunk 4: %d hashes, want 2", len(got))
	}
	full := h.Hashes(tokens[:8])
	if got[0] != full[0] || got[1] != full[1] {
		t.Fatal("trailing partial chunk changed the hashes")
	}
	if n := len(h.Hashes(tokens[:3])); n != 0 {
		t.Fatalf("3 tokens: %d hashes, want 0", n)
	}
}

func TestHashesChainDependency(t *testing.T) {
	h := mustHasher(t, 4)
	base := seqTokens(12, 3)
	orig := h.Hashes(base)

	c1 := append([]uint32(nil), base...)
	c1[5]++ // chunk 1
	mod := h.Hashes(c1)
	if mod[0] != orig[0] {
		t.Fatal("changing chunk 1 changed chunk 0")
	}
	if mod[1] == orig[1] || mod[2] == orig[2] {
		t.Fatal("changing chunk 1 did not change chunks 1 and 2")
	}

	// The same chunk content at another position hashes differently.
	rep := append(append([]uint32(nil), base[:4]...), base[:4]...)
	hs := h.Hashes(rep)
	if hs[0] == hs[1] {
		t.Fatal("identical chunk contents at positions 0 and 1 hash the same")
	}
}

func TestNewHasherErrors(t *testing.T) {
	for _, alg := range []string{"builtin", "sha256_cbor", "", "BLAKE3"} {
		if _, err := NewHasher(256, alg); err == nil || !strings.Contains(err.Error(), "blake3") {
			t.Errorf("algorithm %q: err = %v, want an error naming blake3", alg, err)
		}
	}
	for _, cs := range []int{0, -1} {
		if _, err := NewHasher(cs, "blake3"); err == nil {
			t.Errorf("chunk size %d accepted", cs)
		}
	}
	h := mustHasher(t, 256)
	if h.ChunkSize() != 256 {
		t.Fatalf("ChunkSize = %d", h.ChunkSize())
	}
}

type goldenFile struct {
	Comment  string       `json:"comment"`
	NoneHash string       `json:"none_hash"`
	Cases    []goldenCase `json:"cases"`
}

type goldenCase struct {
	ChunkSize int      `json:"chunk_size"`
	Tokens    []uint32 `json:"tokens"`
	Hashes    []string `json:"hashes"`
}

// TestGoldenVectors pins the scheme: the committed digests must equal both
// the Hasher and the independent reference, so a change to the none hash or
// the packing shows up as a diff of testdata, not silently.
func TestGoldenVectors(t *testing.T) {
	path := filepath.Join("testdata", "blake3_chain.json")
	if *update {
		g := goldenFile{
			Comment:  "kvdock chained BLAKE3 chunk hashes; none hash = BLAKE3(12 zero bytes); tokens big-endian uint32",
			NoneHash: hex.EncodeToString(func() []byte { n := NoneHash(); return n[:] }()),
		}
		for _, c := range []struct {
			cs     int
			tokens []uint32
		}{
			{1, []uint32{0}},
			{2, []uint32{1, 2, 3}},
			{4, []uint32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
			{4, []uint32{0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 151643, 128000, 1, 0, 42}},
			{16, seqTokens(40, 99)},
		} {
			gc := goldenCase{ChunkSize: c.cs, Tokens: c.tokens}
			for _, d := range mustHasher(t, c.cs).Hashes(c.tokens) {
				gc.Hashes = append(gc.Hashes, hex.EncodeToString(d[:]))
			}
			g.Cases = append(g.Cases, gc)
		}
		b, err := json.MarshalIndent(g, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var g goldenFile
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	none := blake3.Sum256(make([]byte, 12))
	if g.NoneHash != hex.EncodeToString(none[:]) {
		t.Fatalf("golden none hash %s, independent %x", g.NoneHash, none)
	}
	if len(g.Cases) == 0 {
		t.Fatal("no golden cases")
	}
	for i, c := range g.Cases {
		got := mustHasher(t, c.ChunkSize).Hashes(c.Tokens)
		ref := refChain(t, c.ChunkSize, c.Tokens)
		if len(got) != len(c.Hashes) || len(ref) != len(c.Hashes) {
			t.Fatalf("case %d: %d/%d hashes, golden has %d", i, len(got), len(ref), len(c.Hashes))
		}
		for j, want := range c.Hashes {
			if hex.EncodeToString(got[j][:]) != want || hex.EncodeToString(ref[j][:]) != want {
				t.Fatalf("case %d chunk %d: hasher %x, reference %x, golden %s", i, j, got[j], ref[j], want)
			}
		}
	}
}

// TestKeySetGroups: WithGroups orders a chunk's keys group by group, each
// rank-minor, gives every group its own keys, and PerChunk and Len count
// them; one group is the plain order.
func TestKeySetGroups(t *testing.T) {
	h, err := NewHasher(4, "blake3")
	if err != nil {
		t.Fatal(err)
	}
	hs := h.Hashes([]uint32{1, 2, 3, 4, 5, 6, 7, 8})
	plain := newKeySet(hs, "m", 2, nil, "")
	g := plain.WithGroups(3)
	if g.PerChunk() != 6 || g.Len() != 12 || plain.PerChunk() != 2 || plain.WithGroups(0).PerChunk() != 2 {
		t.Fatalf("per chunk %d, len %d", g.PerChunk(), g.Len())
	}
	all := g.All()
	seen := map[ObjectKey]bool{}
	for i, k := range all {
		chunk, grp, rank := i/6, uint32(i%6/2), KVRank(2, i%2)
		if k.Chunk != hs[chunk] || k.Group != grp || k.KVRank != rank {
			t.Fatalf("key %d = %v, want chunk %d group %d rank %08x", i, k, chunk, grp, rank)
		}
		if seen[k] {
			t.Fatalf("key %d repeats", i)
		}
		seen[k] = true
	}
	if got := g.Append(nil, 1, 2); len(got) != 6 || got[0] != all[6] {
		t.Fatalf("Append(1, 2) = %v", got)
	}
	if s := all[2].String(); !strings.Contains(s, "/g1") {
		t.Fatalf("String of a group 1 key: %s", s)
	}
}

func TestHashesAfterContinuesTheChain(t *testing.T) {
	h, err := NewHasher(4, AlgorithmBLAKE3)
	if err != nil {
		t.Fatal(err)
	}
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}
	all := h.Hashes(toks)
	if got := h.HashesAfter(NoneHash(), toks); len(got) != 3 || got[0] != all[0] || got[2] != all[2] {
		t.Fatalf("from the start: %x, want %x", got, all)
	}
	if got := h.HashesAfter(all[0], toks[4:]); len(got) != 2 || got[0] != all[1] || got[1] != all[2] {
		t.Fatalf("after the first chunk: %x, want %x", got, all[1:])
	}
}

// TestKeySetLayouts: a set over two layouts (one of two groups) has, per
// chunk, the first layout's keys then the second's, each naming its ID.
func TestKeySetLayouts(t *testing.T) {
	h, err := NewHasher(4, "blake3")
	if err != nil {
		t.Fatal(err)
	}
	hs := h.Hashes([]uint32{1, 2, 3, 4, 5, 6, 7, 8})
	ks := newKeySet(hs, "m", 2, nil, "").WithLayouts([]uint64{7, 9}, []int{1, 2})
	if ks.PerChunk() != 6 || ks.Groups() != 3 || ks.Len() != 12 {
		t.Fatalf("per chunk %d, groups %d, len %d", ks.PerChunk(), ks.Groups(), ks.Len())
	}
	layouts := []uint64{7, 7, 9, 9, 9, 9}
	groups := []uint32{0, 0, 0, 0, 1, 1}
	for i, k := range ks.All() {
		j := i % 6
		if k.Chunk != hs[i/6] || k.Layout != layouts[j] || k.Group != groups[j] || k.KVRank != KVRank(2, i%2) {
			t.Fatalf("key %d = %v", i, k)
		}
	}
	one := newKeySet(hs, "m", 1, nil, "").WithLayout(5).All()
	if len(one) != 2 || one[0].Layout != 5 || !strings.Contains(one[0].String(), "/l0000000000000005") {
		t.Fatalf("one layout: %v", one)
	}
}
