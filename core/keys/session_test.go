package keys

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"kvdock/core/testkit/fakeclock"
)

func intp(i int) *int { return &i }

func TestKVRank(t *testing.T) {
	for _, c := range []struct {
		ws, w int
		want  uint32
	}{
		{1, 0, 0x01000100},
		{2, 1, 0x02010201},
		{8, 7, 0x08070807},
		{4, 0, 0x04000400},
	} {
		if got := KVRank(c.ws, c.w); got != c.want {
			t.Errorf("KVRank(%d,%d) = %#08x, want %#08x", c.ws, c.w, got, c.want)
		}
	}
}

func TestObjectKeysOrderAndFields(t *testing.T) {
	hs := mustHasher(t, 2).Hashes([]uint32{1, 2, 3, 4})
	ks := ObjectKeys(hs, "m", 3, nil, "s")
	if len(ks) != 6 {
		t.Fatalf("%d keys, want 6", len(ks))
	}
	for i, k := range ks {
		c, r := i/3, i%3
		want := ObjectKey{Chunk: hs[c], Model: "m", KVRank: KVRank(3, r), Salt: "s"}
		if k != want {
			t.Fatalf("key %d = %v, want %v (chunk-major, rank-minor)", i, k, want)
		}
	}
	one := ObjectKeys(hs, "m", 3, intp(1), "")
	if len(one) != 2 || one[0].KVRank != KVRank(3, 1) || one[1].Chunk != hs[1] || one[0].Salt != "" {
		t.Fatalf("worker 1 keys = %v", one)
	}
	if n := len(ObjectKeys(nil, "m", 3, nil, "")); n != 0 {
		t.Fatalf("no hashes gave %d keys", n)
	}
}

func newSessions(t testing.TB, cs int, clk *fakeclock.Clock) *Sessions {
	return NewSessions(mustHasher(t, cs), 0, clk.Now)
}

func req(id string, tokens []uint32, start, end int) KeyRequest {
	return KeyRequest{RequestID: id, Model: "llama", WorldSize: 2, Worker: nil, Tokens: tokens, Start: start, End: end}
}

func TestSessionObjectKeysRange(t *testing.T) {
	s := newSessions(t, 4, fakeclock.New())
	tokens := seqTokens(18, 1)
	hs := s.Hasher().Hashes(tokens)
	r := req("a", tokens, 4, 12)
	r.Worker = intp(1)
	r.Salt = "tenant"
	ks, err := s.ObjectKeys(r)
	if err != nil {
		t.Fatal(err)
	}
	want := ObjectKeys(hs[1:3], "llama", 2, intp(1), "tenant")
	if fmt.Sprint(ks) != fmt.Sprint(want) {
		t.Fatalf("keys %v, want %v", ks, want)
	}
	all, err := s.ObjectKeys(req("a", tokens, 0, 16))
	if err != nil || len(all) != 8 || all[7] != (ObjectKey{Chunk: hs[3], Model: "llama", KVRank: KVRank(2, 1)}) {
		t.Fatalf("nil worker: %v, %v", all, err)
	}
	if empty, err := s.ObjectKeys(req("a", tokens, 8, 8)); err != nil || len(empty) != 0 {
		t.Fatalf("empty range: %v, %v", empty, err)
	}
}

func TestSessionCachesExtendAndDiverge(t *testing.T) {
	s := newSessions(t, 4, fakeclock.New())
	h := s.Hasher()
	tokens := seqTokens(20, 2) // 5 chunks
	check := func(ts []uint32, wantHashed int64) {
		t.Helper()
		end := len(ts) / 4 * 4
		ks, err := s.ObjectKeys(KeyRequest{RequestID: "r", Model: "m", WorldSize: 1, Tokens: ts, End: end})
		if err != nil {
			t.Fatal(err)
		}
		fresh := ObjectKeys(h.Hashes(ts), "m", 1, nil, "")
		if fmt.Sprint(ks) != fmt.Sprint(fresh) {
			t.Fatal("cached keys differ from a fresh hash")
		}
		if got := s.Stats().ChunksHashed; got != wantHashed {
			t.Fatalf("chunks hashed %d, want %d", got, wantHashed)
		}
	}
	check(tokens[:9], 2)  // 2 chunks hashed
	check(tokens[:20], 5) // extension: only chunks 2..4 hashed
	check(tokens[:12], 5) // shorter, agreeing: served from cache
	check(tokens[:20], 5) // the cache kept the longer prefix
	div := append([]uint32(nil), tokens...)
	div[13]++     // chunk 3 differs
	check(div, 7) // chunks 3 and 4 re-hashed
	div2 := append([]uint32(nil), div...)
	div2[0]++
	check(div2, 12) // diverges at chunk 0: all 5 re-hashed
	check(tokens, 17)
	if st := s.Stats(); st.Active != 1 || st.CachedTokens != 20 || st.ChunksReused == 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSessionTTL(t *testing.T) {
	clk := fakeclock.New()
	s := newSessions(t, 4, clk)
	tokens := seqTokens(8, 3)
	if _, err := s.LookupKeys(req("a", tokens, 0, 0)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(300 * time.Second)
	if _, err := s.ObjectKeys(req("b", tokens, 0, 8)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(299 * time.Second) // a is 599 s old: alive
	if n := s.Len(); n != 2 {
		t.Fatalf("Len = %d, want 2", n)
	}
	clk.Advance(time.Second) // a is 600 s old: gone (TTL counts from creation)
	if n := s.Sweep(); n != 1 {
		t.Fatalf("Sweep removed %d, want 1", n)
	}
	if _, ok := s.End("a"); ok {
		t.Fatal("expired session still ended")
	}
	clk.Advance(300 * time.Second)
	if n := s.Len(); n != 0 {
		t.Fatalf("lazy expiry: Len = %d, want 0", n)
	}
	if st := s.Stats(); st.Expired != 2 || st.CachedTokens != 0 {
		t.Fatalf("stats %+v", st)
	}
	// A new request under the old id starts a fresh session and hashes again.
	before := s.Stats().ChunksHashed
	if _, err := s.ObjectKeys(req("b", tokens, 0, 8)); err != nil {
		t.Fatal(err)
	}
	if s.Stats().ChunksHashed != before+2 {
		t.Fatal("expired session's cache was reused")
	}
}

func TestSessionRangeValidation(t *testing.T) {
	s := newSessions(t, 4, fakeclock.New())
	tokens := seqTokens(10, 4) // 2 full chunks
	for _, c := range []struct {
		start, end int
		want       string
	}{
		{1, 4, "multiples of the chunk size"},
		{0, 6, "multiples of the chunk size"},
		{0, 12, "past the 10 tokens"},
		{8, 4, "between 0 and end"},
		{-4, 4, "between 0 and end"},
	} {
		_, err := s.ObjectKeys(req("v", tokens, c.start, c.end))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("[%d,%d): err = %v, want %q", c.start, c.end, err, c.want)
		}
	}
	if _, err := s.ObjectKeys(req("v", tokens, 0, 8)); err != nil {
		t.Fatalf("[0,8) of 10 tokens: %v", err)
	}
}

func TestSaltAndModelRules(t *testing.T) {
	for _, bad := range []string{"a@b", "a/b", `a\b`, "a\x00b", strings.Repeat("x", 129)} {
		if ValidateSalt(bad) == nil {
			t.Errorf("salt %q accepted", bad)
		}
	}
	for _, ok := range []string{"", "tenant-1", strings.Repeat("x", 128), "ünï"} {
		if err := ValidateSalt(ok); err != nil {
			t.Errorf("salt %q rejected: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "org@model"} {
		if ValidateModel(bad) == nil {
			t.Errorf("model %q accepted", bad)
		}
	}
	if err := ValidateModel("meta-llama/Llama-3-8B"); err != nil {
		t.Errorf("model with '/' rejected: %v", err)
	}

	s := newSessions(t, 4, fakeclock.New())
	tokens := seqTokens(8, 5)
	for _, r := range []KeyRequest{
		{RequestID: "x", Model: "a@b", WorldSize: 1, Tokens: tokens, End: 8},
		{RequestID: "x", Model: "", WorldSize: 1, Tokens: tokens, End: 8},
		{RequestID: "x", Model: "m", WorldSize: 1, Tokens: tokens, End: 8, Salt: "a/b"},
		{RequestID: "x", Model: "m", WorldSize: 0, Tokens: tokens, End: 8},
		{RequestID: "x", Model: "m", WorldSize: 256, Tokens: tokens, End: 8},
		{RequestID: "x", Model: "m", WorldSize: 2, Worker: intp(2), Tokens: tokens, End: 8},
		{RequestID: "x", Model: "m", WorldSize: 2, Worker: intp(-1), Tokens: tokens, End: 8},
	} {
		if _, err := s.ObjectKeys(r); err == nil {
			t.Errorf("%+v accepted", r)
		}
		if r.Worker == nil {
			if _, err := s.LookupKeys(r); err == nil {
				t.Errorf("lookup %+v accepted", r)
			}
		}
	}
	if s.Len() != 0 {
		t.Fatal("an invalid request created a session")
	}
}

func TestLookupKeysAndEnd(t *testing.T) {
	s := newSessions(t, 4, fakeclock.New())
	tokens := seqTokens(14, 6)  // 3 full chunks
	r := req("L", tokens, 4, 8) // start/end ignored by a lookup
	r.Worker = intp(1)          // ignored too: a lookup covers every rank
	r.Salt = "s1"
	ks, err := s.LookupKeys(r)
	if err != nil {
		t.Fatal(err)
	}
	want := ObjectKeys(s.Hasher().Hashes(tokens), "llama", 2, nil, "s1")
	if ks.Chunks() != 3 || ks.PerChunk() != 2 || ks.Len() != 6 || fmt.Sprint(ks.All()) != fmt.Sprint(want) {
		t.Fatalf("lookup keys %v, want %v", ks, want)
	}
	// A worker-side request with diverging tokens must not change what
	// END_SESSION touches.
	other := seqTokens(16, 7)
	if _, err := s.ObjectKeys(req("L", other, 0, 16)); err != nil {
		t.Fatal(err)
	}
	end, ok := s.End("L")
	if !ok || fmt.Sprint(end.All()) != fmt.Sprint(want) {
		t.Fatalf("End = %v, %v; want the lookup keys", end, ok)
	}
	if _, ok := s.End("L"); ok {
		t.Fatal("second End found the session")
	}
	if _, err := s.ObjectKeys(req("W", tokens, 0, 4)); err != nil {
		t.Fatal(err)
	}
	if ks, ok := s.End("W"); !ok || ks.Len() != 0 {
		t.Fatalf("End without lookup = %v, %v; want no keys, true", ks.All(), ok)
	}
	// No full chunk: no keys, no session.
	if ks, err := s.LookupKeys(req("short", tokens[:3], 0, 0)); err != nil || ks.Len() != 0 || s.Len() != 0 {
		t.Fatalf("short lookup: %v, %v, %d sessions", ks.All(), err, s.Len())
	}
}

func TestSessionLimits(t *testing.T) {
	s := newSessions(t, 4, fakeclock.New())
	tokens := seqTokens(8, 8) // 2 chunks each
	s.SetLimits(Limits{MaxSessions: 2})
	for _, id := range []string{"a", "b", "c"} {
		if _, err := s.LookupKeys(req(id, tokens, 0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := s.End("a"); ok {
		t.Fatal("oldest session survived the session cap")
	}
	if s.Len() != 2 {
		t.Fatalf("Len = %d, want 2", s.Len())
	}
	per := s.Stats().CachedBytes / 2
	if per < 8*4+2*32 {
		t.Fatalf("a session of 8 tokens and 2 digests counted as %d bytes", per)
	}
	s.SetLimits(Limits{MaxBytes: per * 3 / 2}) // one session fits, two do not
	if st := s.Stats(); st.Active != 1 || st.CachedTokens != 8 || st.CachedBytes != per {
		t.Fatalf("after SetLimits: %+v", st)
	}
	if _, ok := s.End("c"); !ok {
		t.Fatal("newest session evicted")
	}
	if _, err := s.LookupKeys(req("big", seqTokens(40, 9), 0, 0)); err != nil {
		t.Fatal(err) // one session larger than the bound is kept while used
	}
	if st := s.Stats(); st.Active != 1 || st.CachedTokens != 40 || st.Evicted != 2 {
		t.Fatalf("stats %+v", st)
	}
	if got := s.Limits(); got.MaxSessions != DefaultMaxSessions || got.MaxRequestTokens != DefaultMaxRequestTokens {
		t.Fatalf("zero fields did not restore defaults: %+v", got)
	}
}

func TestSessionsConcurrent(t *testing.T) {
	s := newSessions(t, 4, fakeclock.New())
	h := s.Hasher()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				id := fmt.Sprint("req", i%5)
				tokens := seqTokens(4*(1+(g+i)%7), uint32(i%5))
				ks, err := s.ObjectKeys(KeyRequest{RequestID: id, Model: "m", WorldSize: 1, Tokens: tokens, End: len(tokens)})
				if err != nil {
					errs <- err
					return
				}
				if fmt.Sprint(ks) != fmt.Sprint(ObjectKeys(h.Hashes(tokens), "m", 1, nil, "")) {
					errs <- fmt.Errorf("goroutine %d iteration %d: wrong keys", g, i)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
