package nextuse

import (
	"math/rand/v2"
	"testing"
)

// objs is a plain Items: orders by index.
type objs []Order

func (o objs) Order(i int32) *Order { return &o[i] }

// naiveVictim is Victim by a scan: the earliest late of the objects late
// at now, else the latest due (ties: the later stamp).
func naiveVictim(o objs, in []bool, now uint64) int32 {
	best := int32(-1)
	for i := range o {
		if in[i] && o[i].LateAt() < now && (best < 0 || o[i].LateAt() < o[best].LateAt()) {
			best = int32(i)
		}
	}
	if best >= 0 {
		return best
	}
	for i := range o {
		if !in[i] {
			continue
		}
		if best < 0 || before(false, &o[i], &o[best]) {
			best = int32(i)
		}
	}
	return best
}

// same reports whether victims a and b are the same choice: both none,
// both late as early, or both not late and due alike (ties either way).
func same(o objs, a, b int32, now uint64) bool {
	if a < 0 || b < 0 {
		return a == b
	}
	x, y := &o[a], &o[b]
	if lx, ly := x.LateAt() < now, y.LateAt() < now; lx || ly {
		return lx && ly && x.LateAt() == y.LateAt()
	}
	return !before(false, x, y) && !before(false, y, x)
}

// TestHeapsMatchNaiveOrder drives the heaps with uses, pushes and removals
// and checks each victim against a scan.
func TestHeapsMatchNaiveOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	o := make(objs, 64)
	in := make([]bool, len(o))
	var c Clock
	var h Heaps
	for i := range o {
		o[i] = New(c.Tick())
	}
	for step := range 20000 {
		i := int32(r.IntN(len(o)))
		switch r.IntN(4) {
		case 0:
			c.Use(&o[i])
			Fix(&h, o, i)
		case 1:
			if !in[i] {
				Push(&h, o, i, c.Prior(len(o)))
				in[i] = true
			}
		case 2:
			Remove(&h, o, i)
			in[i] = false
		default:
			c.Refresh(&o[i])
			Fix(&h, o, i)
		}
		if !Check(&h, o) {
			t.Fatalf("step %d: heaps out of order", step)
		}
		got, want := Victim(&h, o, c.Now), naiveVictim(o, in, c.Now)
		if !same(o, got, want, c.Now) {
			t.Fatalf("step %d: victim %d, a scan says %d", step, got, want)
		}
	}
}

// TestBuildMatchesPushes: heaps built at once hold their order and each
// object's place, give the victim a scan gives, and then take pushes,
// uses and removals as pushed heaps do.
func TestBuildMatchesPushes(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	o := make(objs, 500)
	in := make([]bool, len(o))
	var c Clock
	var built []int32
	for i := range o {
		o[i] = New(c.Tick())
		c.Now += uint64(r.IntN(5))
		o[i].Gap = uint64(1 + r.IntN(300))
		o[i].Measured = r.IntN(2) == 0
		if r.IntN(3) > 0 {
			built, in[i] = append(built, int32(i)), true
		}
	}
	var h Heaps
	Build(&h, o, built)
	if !Check(&h, o) || h.Len() != len(built) {
		t.Fatalf("built heaps out of order (%d of %d objects)", h.Len(), len(built))
	}
	for step := range 5000 {
		if got, want := Victim(&h, o, c.Now), naiveVictim(o, in, c.Now); !same(o, got, want, c.Now) {
			t.Fatalf("step %d: victim %d, a scan says %d", step, got, want)
		}
		i := int32(r.IntN(len(o)))
		switch {
		case in[i] && r.IntN(2) == 0:
			Remove(&h, o, i)
			in[i] = false
		case in[i]:
			c.Use(&o[i])
			Fix(&h, o, i)
		default:
			Push(&h, o, i, c.Prior(len(o)))
			in[i] = true
		}
		c.Tick()
		if !Check(&h, o) {
			t.Fatalf("step %d: heaps out of order", step)
		}
	}
}

// TestLateWaitsHalfAGapOnceMeasured: an object with a measured gap, or one
// lent by a parent that measured it, is late half a gap after it is due;
// one on the mean is late when due.
func TestLateWaitsHalfAGapOnceMeasured(t *testing.T) {
	var c Clock
	parent := New(c.Tick())
	c.Now += 99
	c.Use(&parent) // gap 100, measured
	child := New(c.Tick())
	if !Inherit(&child, &parent) || child.Gap != 100 || !child.Measured {
		t.Fatalf("child lent %+v by %+v", child, parent)
	}
	if got := child.LateAt(); got != child.Stamp+150 {
		t.Errorf("lent measured gap: late at %d, want %d", got, child.Stamp+150)
	}
	root := New(c.Tick())
	root.Gap = c.Prior(1)
	if got := root.LateAt(); got != root.Stamp+root.Gap {
		t.Errorf("gap on the mean: late at %d, want its due time %d", got, root.Stamp+root.Gap)
	}
	if Inherit(&child, &root) {
		t.Error("a gap once lent was lent again")
	}
}

// TestRefreshLearnsNoGap: a second touch of the same use moves the stamp
// and leaves the gap and the mean alone.
func TestRefreshLearnsNoGap(t *testing.T) {
	var c Clock
	o := New(c.Tick())
	c.Now += 9
	c.Use(&o)
	gap, mean := o.Gap, c.MeanGap
	c.Now += 500
	c.Refresh(&o)
	if o.Gap != gap || c.MeanGap != mean || o.Stamp != c.Now {
		t.Errorf("after a refresh: gap %d (was %d), mean %d (was %d), stamp %d (now %d)", o.Gap, gap, c.MeanGap, mean, o.Stamp, c.Now)
	}
}

// TestRequestSharesOneTick: the uses and stores of one request take one
// tick, so a gap counts the requests between two uses, whatever the number
// of objects each carried; outside a request each takes its own.
func TestRequestSharesOneTick(t *testing.T) {
	var c Clock
	a, b := New(c.Tick()), New(c.Tick()) // two ticks: no request open
	if a.Stamp != 1 || b.Stamp != 2 {
		t.Fatalf("stamps %d, %d outside a request, want 1, 2", a.Stamp, b.Stamp)
	}
	c.Begin()
	fresh := make([]Order, 50)
	for i := range fresh {
		fresh[i] = New(c.Tick())
	}
	c.End()
	if fresh[0].Stamp != 3 || fresh[49].Stamp != 3 {
		t.Fatalf("a request's 50 stores stamped %d..%d, want 3", fresh[0].Stamp, fresh[49].Stamp)
	}
	c.Begin()
	c.Use(&a)
	c.Use(&b)
	c.Use(&a) // twice in one request: one use
	c.End()
	if a.Gap != 3 || b.Gap != 2 || a.Stamp != 4 || b.Stamp != 4 {
		t.Errorf("a %+v, b %+v: want gaps 3 and 2 at tick 4", a, b)
	}
}

// TestResume: a chunk stored again takes its own history back, the mean
// of the ticks since its last use and its old gap; strictly (no gap to
// lend), only when it came back within half to twice that gap.
func TestResume(t *testing.T) {
	cases := []struct {
		now, last, gap uint64
		strict         bool
		want           uint64
		ok             bool
	}{
		{now: 1000, last: 400, gap: 0, want: 600, ok: true},   // no gap measured: the ticks since
		{now: 1000, last: 400, gap: 200, want: 400, ok: true}, // the mean of 600 and 200
		{now: 1000, last: 400, gap: 400, strict: true, want: 500, ok: true},
		{now: 1000, last: 400, gap: 200, strict: true},     // back at 3 × its gap: says nothing
		{now: 1000, last: 900, gap: 400, strict: true},     // at a quarter of it
		{now: 1000, last: 400, gap: 0, strict: true},       // no gap to judge by
		{now: 1000, last: 1000, gap: 0, want: 1, ok: true}, // never 0: 0 is "no gap"
		{now: 10, last: 20, gap: 0, want: 1, ok: true},     // a stamp past now (a restart) does not wrap
	}
	for _, c := range cases {
		got, ok := Resume(c.now, c.last, c.gap, c.strict)
		if ok != c.ok || ok && got != c.want {
			t.Errorf("Resume(%d, %d, %d, %v) = %d, %v; want %d, %v", c.now, c.last, c.gap, c.strict, got, ok, c.want, c.ok)
		}
	}
}

// TestAdmits: a store may evict a victim that is late or unused since its
// store whenever, and any other only when it is due back no sooner than
// the store's chunks.
func TestAdmits(t *testing.T) {
	var c Clock
	v := Stored(c.Tick()) // tick 1
	v.Gap = 10
	if !Admits(&v, 2, 5, false) || !Admits(&v, 2, 5, true) {
		t.Error("a victim unused since its store refuses a store")
	}
	for range 4 {
		c.Tick()
	}
	c.Use(&v) // tick 6: used, gap 5 measured; due at 11, late after 13
	if v.Unused {
		t.Fatal("a use leaves the victim unused")
	}
	for _, tc := range []struct {
		now, due uint64
		want     bool
	}{
		{7, 11, true},  // due back as the store's chunks
		{7, 10, true},  // later than them
		{7, 12, false}, // before them: Belady would not store them
		{14, 30, true}, // late
	} {
		for _, newPrompt := range []bool{false, true} { // v is not hot
			if got := Admits(&v, tc.now, tc.due, newPrompt); got != tc.want {
				t.Errorf("at %d, a store due at %d (new prompt %v): Admits = %v, want %v", tc.now, tc.due, newPrompt, got, tc.want)
			}
		}
	}
}

// TestAdmitsHot: a chunk used HotUses times is evicted for a new prompt
// only once it is hotLate gaps past late; a continuation's store evicts
// it as it would any other.
func TestAdmitsHot(t *testing.T) {
	var c Clock
	v := Stored(c.Tick())
	for range HotUses {
		c.Tick()
		c.Use(&v) // a gap of 2 each time (Use takes a tick)
	}
	if v.Uses != HotUses || v.Gap != 2 {
		t.Fatalf("after %d uses 2 ticks apart: %d uses, gap %d", HotUses, v.Uses, v.Gap)
	}
	late := v.LateAt() // 3 ticks past its last use
	for _, tc := range []struct {
		now       uint64
		newPrompt bool
		want      bool
	}{
		{late + 1, false, true},                // late: a continuation evicts it
		{late + 1, true, false},                // a new prompt does not
		{late + hotLate*v.Gap, true, false},    // not yet hotLate gaps past late
		{late + hotLate*v.Gap + 1, true, true}, // long late: a hot prompt that stopped goes
		{v.Stamp + 1, true, false},             // due before the new prompt's chunks anyway
	} {
		if got := Admits(&v, tc.now, tc.now+100, tc.newPrompt); got != tc.want {
			t.Errorf("at %d (late at %d), new prompt %v: Admits = %v, want %v", tc.now, late, tc.newPrompt, got, tc.want)
		}
	}
	for range 300 {
		c.Use(&v)
		c.Tick()
	}
	if v.Uses != 255 {
		t.Errorf("uses %d after 316 uses, want 255 (saturated)", v.Uses)
	}
}

// TestBranch: an object that branches off is late from the next tick on,
// lends its children no gap either, and measures its own at its first use.
func TestBranch(t *testing.T) {
	var c Clock
	o := Stored(c.Tick())
	Branch(&o)
	if o.Measured || o.LateAt() >= c.Now+2 {
		t.Errorf("a branch has gap %d (measured %v), late at %d: want late from tick %d on", o.Gap, o.Measured, o.LateAt(), c.Now+1)
	}
	kid := Stored(c.Now)
	if Inherit(&kid, &o); kid.Measured || kid.Gap != o.Gap {
		t.Errorf("a branch's child has gap %d (measured %v), want the branch's %d, not measured", kid.Gap, kid.Measured, o.Gap)
	}
	for range 6 {
		c.Tick()
	}
	c.Use(&o) // the 7th tick after its store
	if !o.Measured || o.Gap != 7 {
		t.Errorf("a branch used 7 ticks after its store has gap %d (measured %v), want 7 of its own", o.Gap, o.Measured)
	}
}
