package l1

import (
	"errors"
	"strings"
	"testing"

	"kvdock/core/testkit/fakeclock"
)

// privatePool is sharedPool's pool planned in a private segment instead
// (--shm-name ""), named for the test.
func privatePool(t *testing.T, dir string, units int64, c *fakeclock.Clock) Options {
	t.Helper()
	opts := sharedPool(t, dir, units, c)
	opts.Plan = Decision{Private: PrivateSegmentName(t.Name(), 1), Reason: `--shm-name "" given`}
	return opts
}

// storeOne publishes one object of n bytes filled with b and returns where.
func storeOne(t *testing.T, p *Pool, b byte, n int64) Reservation {
	t.Helper()
	res, err := p.ReserveWrite(InstanceOwner(1), keyRange(int(b), int(b)+1), n)
	if err != nil {
		t.Fatal(err)
	}
	fill(p, res[0].Offset, res[0].Length, b)
	p.FinishWrite(res)
	return res[0]
}

// A pool planned private is kept and adopted whole, and stays private:
// never Shared, so registration never advertises it.
func TestPrivatePoolKeptAndAdopted(t *testing.T) {
	dir := testShmDir(t)
	c := fakeclock.New()
	opts := privatePool(t, dir, 16, c)
	p, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	if d := p.Decision(); d.Shared || d.Segment != "" || d.Private != opts.Plan.Private {
		t.Fatalf("decision %+v, want the private segment %s", d, opts.Plan.Private)
	}
	r := storeOne(t, p, 7, 5000)
	var kept Kept
	if err := p.Keep(func(k Kept) error { kept = k; return nil }); err != nil {
		t.Fatalf("keep a private pool: %v", err)
	}
	q, ad, err := Adopt(opts, kept)
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	defer q.Close()
	if d := q.Decision(); d.Shared || d.Segment != "" || d.Private != opts.Plan.Private || ad.Objects != 1 {
		t.Fatalf("adopted %+v, decision %+v", ad, d)
	}
	v, done := q.View(r.Offset, r.Length)
	defer done()
	for i, b := range v {
		if b != 7 {
			t.Fatalf("byte %d is %d after adoption, want 7", i, b)
		}
	}
}

// Adoption follows the plan, whatever the record says: a kept private
// segment is not adopted for a shared plan (it would be advertised), nor a
// shared segment for a private plan (it would be hidden from its workers).
func TestHostileAdoptKeepsPrivateAndSharedApart(t *testing.T) {
	dir := testShmDir(t)
	c := fakeclock.New()
	keep := func(opts Options) Kept {
		t.Helper()
		p, err := Open(opts)
		if err != nil {
			t.Fatal(err)
		}
		storeOne(t, p, 3, 4096)
		var k Kept
		if err := p.Keep(func(kk Kept) error { k = kk; return nil }); err != nil {
			t.Fatal(err)
		}
		return k
	}
	private, shared := privatePool(t, dir, 16, c), sharedPool(t, dir, 16, c)
	keptPrivate, keptShared := keep(private), keep(shared)
	for name, tc := range map[string]struct {
		opts Options
		k    Kept
		want string
	}{
		"private kept, shared plan":    {shared, keptPrivate, "is private (never advertised)"},
		"private kept, anonymous plan": {Options{Size: private.Size, Align: private.Align, ShmDir: dir}, keptPrivate, "is private"},
		"shared kept, private plan":    {private, keptShared, "is shared, this start's pool is private"},
	} {
		if q, _, err := Adopt(tc.opts, tc.k); !errors.Is(err, ErrNotAdoptable) || !strings.Contains(err.Error(), tc.want) {
			if q != nil {
				_ = q.Close()
			}
			t.Errorf("%s: %v, want ErrNotAdoptable saying %q", name, err, tc.want)
		}
	}
	// Refusals took nothing: each is still adoptable by a plan of its
	// kind, a private one under its kept name whatever the plan names (an
	// endpoint changed in place kept its old name).
	moved := private
	moved.Plan.Private = PrivateSegmentName("another endpoint", 2)
	for _, tc := range []struct {
		opts Options
		k    Kept
	}{{moved, keptPrivate}, {shared, keptShared}} {
		q, _, err := Adopt(tc.opts, tc.k)
		if err != nil {
			t.Fatalf("adopt by its own plan after the refusals: %v", err)
		}
		_ = q.Close()
	}
}
