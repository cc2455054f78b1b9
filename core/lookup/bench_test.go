package lookup

import (
	"fmt"
	"testing"

	"kvdock/core/keys"
	"kvdock/core/testkit/chainbench"
)

// hitStore finds every key, so a lookup's cost is the key path alone.
type hitStore struct{}

func (hitStore) ReserveLookup(_, _ string, ks []keys.ObjectKey, _ int) (int, bool) {
	return len(ks), false
}
func (hitStore) FinishRead([]keys.ObjectKey, int) {}
func (hitStore) Touch([]keys.ObjectKey)           {}

type allLayouts struct{}

func (allLayouts) Registered(string, int) ([]uint64, []int) { return []uint64{0}, []int{1} }

// BenchmarkLookup32k runs LOOKUP + QUERY_PREFETCH_STATUS for a 32k-token
// prompt (128 chunks of 256 tokens, world size 1): "cold" with a new request
// id each time (every chunk hashed), "cached" with the session of an earlier
// lookup of the same prompt (hashes served from the session).
func BenchmarkLookup32k(b *testing.B) {
	const chunk, n = 256, 32768
	tokens := make([]uint32, n)
	for i := range tokens {
		tokens[i] = uint32(i*2654435761) >> 15
	}
	for _, mode := range []string{"cold", "cached"} {
		b.Run(mode, func(b *testing.B) {
			h, err := keys.NewHasher(chunk, "blake3")
			if err != nil {
				b.Fatal(err)
			}
			s := keys.NewSessions(h, 0, nil)
			s.SetLimits(keys.Limits{MaxSessions: 16})
			m := New(s, hitStore{}, allLayouts{}, Options{})
			ids := make([]string, b.N)
			for i := range ids {
				ids[i] = "req"
				if mode == "cold" {
					ids[i] = fmt.Sprint("req-", i)
				}
			}
			r := keys.KeyRequest{Model: "m", WorldSize: 1, Tokens: tokens}
			if mode == "cached" {
				r.RequestID = "req"
				if err := m.Lookup(r, 1); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				r.RequestID = ids[i]
				if err := m.Lookup(r, 1); err != nil {
					b.Fatal(err)
				}
				if hit, _ := m.QueryStatus(r.RequestID); hit != n/chunk {
					b.Fatalf("hit %d chunks", hit)
				}
			}
			b.StopTimer()
			ratio := chainbench.PairedRatio(b.N, func(j int) {
				r.RequestID = "req"
				if mode == "cold" {
					r.RequestID = fmt.Sprint("pair-", j)
				}
				if err := m.Lookup(r, 1); err != nil {
					b.Fatal(err)
				}
				m.QueryStatus(r.RequestID)
			}, chainbench.Messages(h.Hashes(tokens), keys.NoneHash(), h.ChunkSize(), tokens))
			b.ReportMetric(ratio, "x-raw-blake3")
		})
	}
}
