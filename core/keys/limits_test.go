package keys

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"kvdock/core/testkit/fakeclock"
)

func heapAfterGC() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

func TestRequestTokenCap(t *testing.T) {
	if DefaultMaxRequestTokens != 2_097_152 {
		t.Fatalf("DefaultMaxRequestTokens = %d: keep it equal to the wire decoder's cap", DefaultMaxRequestTokens)
	}
	s := newSessions(t, 4, fakeclock.New())
	over := make([]uint32, DefaultMaxRequestTokens+4)
	if _, err := s.ObjectKeys(req("big", over, 0, 4)); err == nil || !strings.Contains(err.Error(), "at most 2097152 per request") {
		t.Fatalf("worker-side request of %d tokens: err = %v", len(over), err)
	}
	if _, err := s.LookupKeys(req("big", over, 0, 0)); err == nil {
		t.Fatalf("lookup of %d tokens accepted", len(over))
	}
	if st := s.Stats(); st.Active != 0 || st.ChunksHashed != 0 {
		t.Fatalf("a rejected request left state: %+v", st)
	}

	s.SetLimits(Limits{MaxRequestTokens: 8})
	if _, err := s.ObjectKeys(req("at", seqTokens(8, 1), 0, 8)); err != nil {
		t.Fatalf("8 tokens at a cap of 8: %v", err)
	}
	if _, err := s.ObjectKeys(req("past", seqTokens(12, 1), 0, 8)); err == nil {
		t.Fatal("12 tokens accepted at a cap of 8")
	}
	if _, err := s.Keys(req("past", seqTokens(12, 1), 0, 8)); err == nil {
		t.Fatal("Keys: 12 tokens accepted at a cap of 8")
	}
}

func TestIDAndModelCaps(t *testing.T) {
	s := newSessions(t, 4, fakeclock.New())
	ts := seqTokens(8, 2)
	long := strings.Repeat("i", MaxRequestIDLen)
	if _, err := s.ObjectKeys(req(long, ts, 0, 8)); err != nil {
		t.Fatalf("a %d-byte id: %v", len(long), err)
	}
	for _, id := range []string{long + "x", strings.Repeat("i", 8<<20)} {
		_, err := s.ObjectKeys(req(id, ts, 0, 8))
		if err == nil || !strings.Contains(err.Error(), "request_id") {
			t.Fatalf("a %d-byte id: err = %v", len(id), err)
		}
		if len(err.Error()) > 200 {
			t.Fatalf("the error for a %d-byte id is %d bytes long", len(id), len(err.Error()))
		}
	}
	if err := ValidateModel(strings.Repeat("m", MaxModelLen)); err != nil {
		t.Fatal(err)
	}
	for _, model := range []string{strings.Repeat("m", MaxModelLen+1), strings.Repeat("m", 16<<20)} {
		r := req("x", ts, 0, 8)
		r.Model = model
		_, err := s.ObjectKeys(r)
		if err == nil || !strings.Contains(err.Error(), "model_name") || len(err.Error()) > 200 {
			t.Fatalf("a %d-byte model name: err = %v", len(model), err)
		}
	}
	if err := ValidateSalt(strings.Repeat("s", 1<<20)); err == nil || len(err.Error()) > 200 {
		t.Fatalf("a 1 MiB salt: err = %v", err)
	}
	if got := Clip(strings.Repeat("a", 100)); !strings.HasSuffix(got, "(100 bytes)") || len(got) > 60 {
		t.Fatalf("Clip = %q", got)
	}
	if s.Len() != 1 {
		t.Fatalf("%d sessions; only the valid request may create one", s.Len())
	}
}

// A peer sending huge request ids or endless distinct ones must not grow the
// session table past its bounds.
func TestSessionMemoryBounded(t *testing.T) {
	s := newSessions(t, 4, fakeclock.New())
	ts := seqTokens(16, 3)

	before := heapAfterGC()
	for i := range 16 {
		id := strings.Repeat(string(rune('a'+i)), 8<<20)
		if _, err := s.LookupKeys(req(id, ts, 0, 0)); err == nil {
			t.Fatal("8 MiB request id accepted")
		}
		if _, err := s.ObjectKeys(req(id, ts, 0, 8)); err == nil {
			t.Fatal("8 MiB request id accepted")
		}
	}
	grew := heapAfterGC() - before
	t.Logf("16 × 2 requests with 8 MiB ids: heap grew %d KiB, %d sessions", grew>>10, s.Len())
	if grew > 4<<20 || s.Len() != 0 {
		t.Fatalf("8 MiB ids: heap grew %d bytes, %d sessions kept", grew, s.Len())
	}

	const n = 200_000
	pad := strings.Repeat("x", MaxRequestIDLen-8)
	before = heapAfterGC()
	for i := range n {
		if _, err := s.LookupKeys(req(fmt.Sprintf("%s%08d", pad, i), ts, 0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	grew = heapAfterGC() - before
	st := s.Stats()
	t.Logf("%d lookups with distinct 256-byte ids: %d sessions, %d KiB counted, heap grew %d KiB, %d evicted",
		n, st.Active, st.CachedBytes>>10, grew>>10, st.Evicted)
	if st.Active != DefaultMaxSessions || st.Evicted != n-DefaultMaxSessions {
		t.Fatalf("stats %+v", st)
	}
	if grew > 2*st.CachedBytes {
		t.Fatalf("heap grew %d bytes for sessions counted as %d", grew, st.CachedBytes)
	}

	// The byte budget bites before the count when sessions are large.
	s.SetLimits(Limits{MaxBytes: 1 << 20})
	big := seqTokens(16<<10, 4) // ~320 KiB per session: 64 KiB of tokens, 2 × 128 KiB of digests
	for i := range 16 {
		if _, err := s.LookupKeys(req(fmt.Sprint("big", i), big, 0, 0)); err != nil {
			t.Fatal(err)
		}
		if st := s.Stats(); st.CachedBytes > 1<<20 {
			t.Fatalf("after %d large sessions: %d bytes held, budget 1 MiB", i+1, st.CachedBytes)
		}
	}
	if st := s.Stats(); st.Active < 2 || st.Active > 4 {
		t.Fatalf("%d large sessions kept under a 1 MiB budget: %+v", st.Active, st)
	}
}

func TestKeySetBatches(t *testing.T) {
	s := newSessions(t, 4, fakeclock.New())
	ts := seqTokens(40, 5) // 10 chunks
	ks, err := s.LookupKeys(req("b", ts, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	want := ObjectKeys(s.Hasher().Hashes(ts), "llama", 2, nil, "")
	var got []ObjectKey
	for from := -3; from < 12; from += 3 { // out-of-range ends are clamped
		got = ks.Append(got, from, from+3)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("batched keys differ from ObjectKeys")
	}
	if ks.Append(nil, 7, 7) != nil || ks.Append(nil, 12, 20) != nil {
		t.Fatal("an empty range produced keys")
	}
	// A worker-side set copies its digests: a later diverging prompt in the
	// same session must not change keys handed out before.
	w, err := s.Keys(req("b", ts, 4, 12))
	if err != nil {
		t.Fatal(err)
	}
	before := fmt.Sprint(w.All())
	if _, err := s.ObjectKeys(req("b", seqTokens(40, 6), 0, 40)); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(w.All()) != before || w.Chunks() != 2 || w.PerChunk() != 2 {
		t.Fatal("a worker-side KeySet changed when the session's prompt diverged")
	}
	one := req("b", ts, 0, 8)
	one.Worker = intp(1)
	k1, err := s.Keys(one)
	if err != nil || k1.PerChunk() != 1 || k1.Len() != 2 || k1.All()[0].KVRank != KVRank(2, 1) {
		t.Fatalf("one-rank set: %v %v", k1.All(), err)
	}
}
