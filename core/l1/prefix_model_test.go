package l1

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/l1/nextuse"
)

// prefixWorld is a set of prompts that share prefixes (a few system
// prompts, each followed by a few users' turns), hashed as kvdock hashes
// them, with the true parent of every chunk: the ground truth the pool's
// tree is checked against.
type prefixWorld struct {
	prompts [][]keys.Hash
	parent  map[keys.Hash]keys.Hash // absent: the chunk starts a prompt
	ws      int
}

func newPrefixWorld(r *rand.Rand, ws int) *prefixWorld {
	h, _ := keys.NewHasher(4, keys.AlgorithmBLAKE3)
	w := &prefixWorld{parent: map[keys.Hash]keys.Hash{}, ws: ws}
	for sys := range 3 {
		for user := range 4 {
			var toks []uint32
			for c := range 2 + r.IntN(2) { // the system prompt
				toks = append(toks, uint32(sys), uint32(c), 7, 7)
			}
			for c := range 1 + r.IntN(4) { // the user's turns
				toks = append(toks, uint32(100+user), uint32(c), uint32(sys), 9)
			}
			hs := h.Hashes(toks)
			for i := 1; i < len(hs); i++ {
				w.parent[hs[i]] = hs[i-1]
			}
			w.prompts = append(w.prompts, hs)
		}
	}
	return w
}

// keysOf are prompt p's first n chunks on every rank, as a scheduler asks.
func (w *prefixWorld) keysOf(p, n int) []keys.ObjectKey {
	return w.keysIn(p, 0, n)
}

// keysIn are prompt p's chunks [from, to) on every rank.
func (w *prefixWorld) keysIn(p, from, to int) []keys.ObjectKey {
	return keys.ObjectKeys(w.prompts[p][from:to], "m", w.ws, nil, "")
}

// recount walks every record and sums the bytes of the usable ones: not
// doomed, and a first chunk or linked to a resident parent. It also checks
// that every link names the true parent, that a root is a first chunk, and
// the tree's and the heap's own invariants.
func recount(p *Pool, w *prefixWorld) (int64, string) {
	var usable int64
	t := &p.t
	for i := range t.recs {
		r := &t.recs[i]
		if r.state == stateFree || r.doomed {
			if r.state != stateFree && (r.parent != nilRec || r.kid != nilRec || r.ord.Due >= 0 || r.ord.Late >= 0 || r.peer != int32(i)) {
				return 0, fmt.Sprintf("doomed record %d still in the tree, heap or a ring", i)
			}
			continue
		}
		truth, has := w.parent[r.id.chunk]
		if r.root && has {
			return 0, fmt.Sprintf("record %d marked as starting a prompt, but its chunk has a parent", i)
		}
		if r.parent != nilRec {
			pr := &t.recs[r.parent]
			if pr.state == stateFree || pr.doomed || pr.id.chunk != truth || pr.id.rank != r.id.rank || pr.id.group != r.id.group {
				return 0, fmt.Sprintf("record %d linked to record %d, not its resident parent", i, r.parent)
			}
			usable += p.rounded(int32(i))
		} else if r.root {
			usable += p.rounded(int32(i))
		}
		if (r.ord.Due >= 0) != t.candidate(int32(i)) || (r.ord.Late >= 0) != t.candidate(int32(i)) {
			return 0, fmt.Sprintf("record %d: in the heaps %v/%v, evictable leaf %v", i, r.ord.Due >= 0, r.ord.Late >= 0, t.candidate(int32(i)))
		}
		for j := r.peer; j != int32(i); j = t.recs[j].peer {
			if t.recs[j].id.chunk != r.id.chunk {
				return 0, fmt.Sprintf("record %d rings with record %d of another chunk", i, j)
			}
		}
	}
	if !nextuse.Check(&t.heaps, t) {
		return 0, "heap order or places broken"
	}
	return usable, ""
}

// hold is a lock the test's workers hold: a reservation or a read hold,
// perhaps abandoned; it must stay in force until released or its TTL.
type hold struct {
	res       []Reservation
	ref       ReadRef
	isRef     bool
	until     time.Time
	abandoned bool
}

// TestPrefixTreeAgainstRecount runs random stores (from a prompt's start or
// from one of its chunks on, as a worker storing only what LOOKUP missed
// does), lookups, retrieves,
// evictions (each policy), clears, deletes, aborts, abandons and TTL
// expiries, and after every step checks that the usable figure equals a
// full recount, that links name true parents, and that no eviction, clear
// or expiry took the bytes of a lock still in force, abandoned or not.
func TestPrefixTreeAgainstRecount(t *testing.T) {
	seqs, steps := 200, 300
	if testing.Short() {
		seqs = 40
	}
	evictions := map[string]uint64{}
	for seq := range seqs {
		r := rand.New(rand.NewPCG(uint64(seq), 29))
		w := newPrefixWorld(r, 1+r.IntN(2))
		policy := []string{PolicyLRU, PolicyPrefix}[seq%2]
		p, c := newPool(t, int64(24+r.IntN(24)), func(o *Options) {
			o.Policy = policy
			o.WriteTTL, o.ReadTTL = 5*time.Second, 3*time.Second
		})
		var holds []hold
		fail := func(step int, format string, args ...any) {
			t.Helper()
			t.Fatalf("seq %d (%s) step %d: %s", seq, policy, step, fmt.Sprintf(format, args...))
		}
		for step := range steps {
			pr := r.IntN(len(w.prompts))
			n := 1 + r.IntN(len(w.prompts[pr]))
			switch op := r.IntN(20); {
			case op < 7: // a worker stores the prompt's first n chunks, or from chunk s on
				owner := InstanceOwner(int64(1 + r.IntN(2)))
				var res []Reservation
				var err error
				if s := r.IntN(n); s > 0 && r.IntN(3) == 0 {
					res, err = p.ReserveWriteAfter(owner, w.keysIn(pr, s-1, s), w.keysIn(pr, s, n), 4096)
				} else {
					res, err = p.ReserveWrite(owner, w.keysOf(pr, n), 4096)
				}
				if err != nil || len(res) == 0 {
					break
				}
				switch r.IntN(6) {
				case 0:
					p.AbortWrite(res)
				case 1:
					p.Abandon(res, nil)
					holds = append(holds, hold{res: res, until: c.Now().Add(5 * time.Second), abandoned: true})
				case 2:
					holds = append(holds, hold{res: res, until: c.Now().Add(5 * time.Second)})
				default:
					p.FinishWrite(res)
				}
			case op < 12: // LOOKUP, then a worker holds what it found
				ks := w.keysOf(pr, n)
				got := p.ReserveReadPrefix(ks, 1)
				for _, k := range ks[:got] {
					ref, ok := p.HoldRead(k)
					if !ok {
						fail(step, "HoldRead of a key LOOKUP just locked failed")
					}
					h := hold{ref: ref, isRef: true, until: c.Now().Add(3 * time.Second)}
					if r.IntN(4) == 0 {
						p.Abandon(nil, []ReadRef{ref})
						h.abandoned = true
					}
					holds = append(holds, h)
				}
			case op < 14: // workers finish some of what they hold
				for j := 0; j < len(holds); j++ {
					if h := holds[j]; !h.abandoned && r.IntN(2) == 0 {
						if h.isRef {
							p.ReleaseRead([]ReadRef{h.ref})
						} else {
							p.FinishWrite(h.res)
						}
						holds = append(holds[:j], holds[j+1:]...)
						j--
					}
				}
			case op < 16:
				p.Maintain()
			case op == 16:
				if r.IntN(3) == 0 {
					p.Clear()
				} else {
					p.Delete(w.keysOf(pr, n))
				}
			case op == 17:
				p.Touch(w.keysOf(pr, n))
			case op == 18:
				pol := []string{PolicyLRU, PolicyPrefix, PolicyNoop}[r.IntN(3)]
				if err := p.SetEviction(pol, 0.5+r.Float64()/2, 0.1+r.Float64()/2); err != nil {
					fail(step, "%v", err)
				}
			default:
				c.Advance(time.Duration(r.IntN(2000)) * time.Millisecond)
			}
			// Holds past their TTL are the pool's to end.
			now := c.Now()
			for j := 0; j < len(holds); j++ {
				if !now.Before(holds[j].until) {
					holds = append(holds[:j], holds[j+1:]...)
					j--
				}
			}
			p.mu.Lock()
			for _, h := range holds {
				if h.isRef {
					if p.heldBy(h.ref, now.UnixNano()) == nilRec {
						p.mu.Unlock()
						fail(step, "a read hold in force (abandoned %v) lost its object", h.abandoned)
					}
					continue
				}
				for _, rs := range h.res {
					if rec := &p.t.recs[rs.rec]; rec.state != stateWrite || rec.lock != rs.lock {
						p.mu.Unlock()
						fail(step, "a reservation in force (abandoned %v) lost its bytes", h.abandoned)
					}
				}
			}
			got, msg := recount(p, w)
			want := p.t.usableBytes
			p.mu.Unlock()
			if msg != "" {
				fail(step, "%s", msg)
			}
			if got != want {
				fail(step, "usable bytes %d, a full recount gives %d", want, got)
			}
			if s := p.Stats(); s.UsableBytes > s.ResidentBytes {
				fail(step, "usable %d > resident %d", s.UsableBytes, s.ResidentBytes)
			}
		}
		evictions[policy] += p.Stats().Evictions
		p.Close()
	}
	t.Logf("evictions: %v", evictions)
	for _, pol := range []string{PolicyLRU, PolicyPrefix} {
		if evictions[pol] == 0 {
			t.Errorf("no %s eviction happened: the test exercised nothing", pol)
		}
	}
}

// TestObjectMemoryBudget holds the object table, prefix tree and leaf heap
// included, to 256 bytes of Go heap per object at a million objects.
func TestObjectMemoryBudget(t *testing.T) {
	const n = 1 << 20
	per := tableOverhead(t, n)
	t.Logf("%d objects: %.1f bytes per object", n, per)
	if per > 256 {
		t.Errorf("the table holds %.1f bytes per object at %d objects, over the budget of 256", per, n)
	}
}
