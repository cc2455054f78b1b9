package l1

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"kvdock/core/keys"
	"kvdock/core/l1/alloc"
	"kvdock/core/l1/nextuse"
	"kvdock/core/l1/segment"
)

// Keep ends the pool like Close but keeps its segment for a successor
// (Adopt): the table is exported as a Kept, handed to record while this
// process still holds the segment, and only once record succeeds is the
// segment left in place (unmapped, its flock released). Every lock in
// force is recorded with its deadline: a write reservation or a doomed
// object becomes Held (its bytes stay its holder's until the deadline,
// never readable), read locks stay on published objects. Locks whose TTL
// has passed are left out: their bytes are free, as they would be here.
//
// Keep needs the pool quiet: with memory views out, or a pool in anonymous
// memory, it closes the pool as Close does and returns an error (nothing
// is kept). A private segment is kept as a shared one is.
func (p *Pool) Keep(record func(Kept) error) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errors.New("l1: keep: pool already closed")
	}
	if p.views > 0 {
		n := p.views
		p.mu.Unlock()
		return errors.Join(fmt.Errorf("l1: keep: %d memory views still out: pool closed instead", n), p.Close())
	}
	p.closed = true
	k := p.export(p.now().UnixNano())
	p.mu.Unlock()
	err := p.seg.Keep(func(id segment.Identity) error {
		k.Segment = id
		return record(k)
	})
	if err != nil {
		return fmt.Errorf("l1: keep: %w", err)
	}
	return nil
}

// export lists the records, least recently used first; p.mu is held.
func (p *Pool) export(now int64) Kept {
	k := Kept{Size: p.alloc.Size(), Align: p.alloc.Align(), Objects: make([]KeptObject, 0, p.t.len())}
	recs := make([]int32, 0, p.t.len()) // the record of each kept object
	for i := p.t.lru; i != nilRec; i = p.t.recs[i].prev {
		r := &p.t.recs[i]
		locked := r.state == stateWrite || r.readLocked()
		if locked && r.deadline <= now {
			continue // expired: its bytes are free, here as in the successor
		}
		if !locked && r.doomed {
			continue
		}
		o := KeptObject{Key: p.keyOf(i), Offset: r.off, Length: r.length,
			Held: r.doomed || r.detached || r.state == stateWrite, Write: r.state == stateWrite,
			Live: r.state == stateWrite && !r.doomed && !r.detached}
		if locked {
			o.Readers, o.Holds, o.Deadline = r.readers, r.holds, r.deadline
		}
		k.Objects = append(k.Objects, o)
		recs = append(recs, i)
	}
	p.exportLinks(k.Objects, recs)
	k.MeanGap = p.exportOrder(k.Objects, recs)
	return k
}

// keyOf is record i's key.
func (p *Pool) keyOf(i int32) keys.ObjectKey {
	id := p.t.recs[i].id
	n := p.t.nameList[id.name]
	return keys.ObjectKey{Chunk: id.chunk, Model: n.model, Salt: n.salt, KVRank: id.rank, Group: id.group, Layout: n.layout}
}

// CarriedLookupOwner is charged for the read locks a kept pool carried:
// the lookups of the previous process, counted against the lookup cap as
// live ones. Its id is even and not 0, so no request (RequestOwner, odd)
// or the server's own readers (LookupOwner, 0) share it.
func CarriedLookupOwner() Owner { return Owner{Kind: OwnerLookup, ID: 2, Peer: 2} }

// Adopt opens a pool over the kept segment k instead of creating one, and
// restores its table: published objects are readable again, with the read
// locks they had (until their deadlines); held objects keep their bytes
// for their holders, never readable, until their deadlines; objects whose
// deadline has passed give their bytes back; the prompt links are restored
// (restoreLinks: a bad link is dropped, its object adopted unlinked, and
// Adopted says so), so usable bytes and the prefix eviction order are the
// kept pool's. opts must give the kept geometry (Size, Align), and
// opts.Plan the kind of segment: a private segment is adopted only for a
// private plan (under its kept name, as an auto segment is), a shared one
// only for a plan that is not private, so a private pool is never
// advertised and a shared one never hidden. Nothing of k is trusted:
// the segment must be the recorded file (segment.Adopt), and the objects
// must lie aligned inside the pool without overlapping; otherwise nothing
// is adopted and the error (wrapping ErrNotAdoptable, or ErrSegmentBusy
// when a live process holds the segment) says why. A published key
// recorded twice, and carried locks past the caps, cost only those
// objects or locks (Adopted.Dropped; see restore).
func Adopt(opts Options, k Kept) (*Pool, Adopted, error) {
	if opts.Align == 0 {
		opts.Align = DefaultAlign
	}
	if k.Size != opts.Size || k.Align != opts.Align {
		return nil, Adopted{}, fmt.Errorf("%w: kept pool of %d bytes aligned to %d, settings give %d aligned to %d",
			ErrNotAdoptable, k.Size, k.Align, opts.Size, opts.Align)
	}
	switch name := k.Segment.Name; {
	case opts.Plan.Private != "" && !segment.IsPrivate(name):
		return nil, Adopted{}, fmt.Errorf("%w: the kept segment %s is shared, this start's pool is private (%s)", ErrNotAdoptable, name, opts.Plan.Private)
	case opts.Plan.Private == "" && segment.IsPrivate(name):
		return nil, Adopted{}, fmt.Errorf("%w: the kept segment %s is private (never advertised), this start's pool is not", ErrNotAdoptable, name)
	}
	// The pool is built as Open builds it, over anonymous memory that is never
	// touched, and takes the adopted segment before anyone sees it.
	prefault := opts.Prefault
	opts.Plan = Decision{Reason: "adopting"}
	opts.Prefault = false
	p, err := Open(opts)
	if err != nil {
		return nil, Adopted{}, err
	}
	var ad Adopted
	if err := p.restore(k, &ad); err != nil {
		_ = p.Close()
		return nil, Adopted{}, err
	}
	seg, err := segment.Adopt(opts.ShmDir, k.Segment, opts.Size, prefault, p.log, opts.Bytes)
	if err != nil {
		_ = p.Close()
		return nil, Adopted{}, fmt.Errorf("l1: %w", err)
	}
	_ = p.seg.Close() // the untouched anonymous memory
	p.seg = seg
	return p, ad, nil
}

// restore rebuilds the allocator and the table from k; on error the pool
// is left empty. Whatever is wrong with one object costs that object (or
// its lock), counted in ad.Dropped; only objects that overlap refuse the
// whole table, since then no object's bytes can be told to be its own.
//
// Carried locks are charged as live ones are: each deadline is clamped to
// now plus the TTL of its kind, read locks are charged to the lookups (so
// they count against the lookup cap), and the lookups' read locks that no
// worker holds yet are released, most recently used kept first, where they
// would pass the lookup cap or the total cap. Bytes a holder may still be
// using (write reservations, held objects, workers' read holds) stay its
// own until the clamped deadline whatever the caps.
func (p *Pool) restore(k Kept, ad *Adopted) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	live := make([]KeptObject, 0, len(k.Objects))
	for _, o := range k.Objects {
		if (o.Held || o.Readers > 0 || o.Holds > 0) && o.Deadline <= now {
			ad.Expired++
			if o.Held {
				ad.ExpiredHeld++
				continue // its holder's time is up: the bytes are free
			}
			o.Readers, o.Holds, o.Deadline = 0, 0, 0
		}
		locked := o.Write || o.Readers > 0 || o.Holds > 0
		if o.Held && !locked {
			// Nothing would ever free its bytes.
			ad.Dropped.Add("held without a lock", fmt.Sprintf("%q at %d", o.Key.String(), o.Offset))
			continue
		}
		o.Held = o.Held || o.Write // a reservation is never readable
		if end := now + int64(p.ttlOf(o)); o.Deadline > end {
			o.Deadline = end
			ad.Clamped++
		}
		live = append(live, o)
	}
	live = dropDuplicates(live, &ad.Dropped)
	p.budgetReadLocks(live, &ad.Dropped)
	used := make([]alloc.Extent, len(live))
	for i, o := range live {
		used[i] = alloc.Extent{Off: o.Offset, Size: o.Length}
	}
	if err := p.alloc.Carve(used); err != nil {
		return fmt.Errorf("%w: %v", ErrNotAdoptable, err)
	}
	base := p.t.orderBase(k)
	// Held records first: they leave the key index at once, so a published
	// record (or a live reservation) of the same key finds its key free.
	// A chunk's ring holds its objects of the other ranks and KV groups:
	// in a table of one rank and one group each ring is the object alone,
	// and the probes for peers (up to maxPeerProbes finds an object) are
	// skipped.
	rings := false
	for _, o := range live {
		rings = rings || rankWorldSize(o.Key.KVRank) > 1 || o.Key.Group != 0
	}
	p.t.recs = slices.Grow(p.t.recs, len(live))
	var leaves []int32
	for _, held := range []bool{true, false} {
		for _, o := range live {
			if (o.Held && !o.Live) == held {
				if i, leaf := p.adoptObject(o, ad, base, rings); leaf {
					leaves = append(leaves, i)
				}
			}
		}
	}
	p.t.clk.Now = base
	p.restoreLinks(k.Objects, ad)
	// The leaves left once the links are in go to the heaps at once, not
	// one push each before linking and a removal each as a child came.
	n := 0
	for _, i := range leaves {
		if p.t.candidate(i) {
			leaves[n] = i
			n++
		}
	}
	nextuse.Build(&p.t.heaps, &p.t, leaves[:n])
	return nil
}

// ttlOf is the TTL of o's lock kind: a write reservation's or a read's.
func (p *Pool) ttlOf(o KeptObject) time.Duration {
	if o.Write {
		return p.writeTTL
	}
	return p.readTTL
}

// dropDuplicates leaves no published key in live twice: every published
// copy of a repeated key is left out (none can be told to hold the key's
// bytes), a locked one kept as held until its lock ends, so that bytes a
// reader may still be using are not handed out again. O(n log n).
func dropDuplicates(live []KeptObject, d *Drops) []KeptObject {
	pub := make([]int32, 0, len(live))
	for i, o := range live {
		if !o.Held || o.Live {
			pub = append(pub, int32(i))
		}
	}
	slices.SortFunc(pub, func(a, b int32) int { return compareKeys(&live[a].Key, &live[b].Key) })
	dup := make([]bool, len(live))
	for i := 1; i < len(pub); i++ {
		if compareKeys(&live[pub[i-1]].Key, &live[pub[i]].Key) == 0 {
			dup[pub[i-1]], dup[pub[i]] = true, true
		}
	}
	out := live[:0]
	for i, o := range live {
		if !dup[i] {
			out = append(out, o)
			continue
		}
		if o.Write || o.Readers > 0 || o.Holds > 0 {
			o.Held, o.Live = true, false
			out = append(out, o)
			d.Add("key recorded twice (kept unreadable until its lock ends)", fmt.Sprintf("%q at %d", o.Key.String(), o.Offset))
			continue
		}
		d.Add("key recorded twice", fmt.Sprintf("%q at %d", o.Key.String(), o.Offset))
	}
	return out
}

// compareKeys orders object keys by every field the key index tells
// them apart by (chunk, model, salt, layout, rank, group): one chunk
// stored under two layouts of a model is two objects, not a key recorded
// twice. It compares field by field and stops at the first that differs
// (cmp.Or would compare every field of every pair the sort visits).
func compareKeys(a, b *keys.ObjectKey) int {
	if c := bytes.Compare(a.Chunk[:], b.Chunk[:]); c != 0 {
		return c
	}
	if c := strings.Compare(a.Model, b.Model); c != 0 {
		return c
	}
	if c := strings.Compare(a.Salt, b.Salt); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Layout, b.Layout); c != 0 {
		return c
	}
	if c := cmp.Compare(a.KVRank, b.KVRank); c != 0 {
		return c
	}
	return cmp.Compare(a.Group, b.Group)
}

// budgetReadLocks releases, in live, the lookups' read locks that would
// pass the lookup cap or the total cap, least recently used first: only
// those of published objects that no worker holds (nobody reads their
// bytes yet; a PREPARE_RETRIEVE for them misses). p.mu is held.
func (p *Pool) budgetReadLocks(live []KeptObject, d *Drops) {
	var locked, lookups int64 // what stays locked whatever the caps; of it, read locks
	for _, o := range live {
		if o.Write || o.Held || o.Holds > 0 {
			unit := p.alloc.Round(o.Length)
			locked += unit
			if !o.Write {
				lookups += unit
			}
		}
	}
	for i := len(live) - 1; i >= 0; i-- {
		o := &live[i]
		if o.Write || o.Held || o.Holds > 0 || o.Readers == 0 {
			continue
		}
		unit := p.alloc.Round(o.Length)
		if lookups+unit <= p.lookupCap() && locked+unit <= p.totalCap {
			lookups += unit
			locked += unit
			continue
		}
		d.Add("read lock released: lookups past the lock caps", fmt.Sprintf("%q, %d bytes", o.Key.String(), unit))
		o.Readers, o.Deadline = 0, 0
	}
}

// adoptObject adds one recorded object; p.mu is held and its bytes are
// carved out of the allocator.
func (p *Pool) adoptObject(o KeptObject, ad *Adopted, base uint64, rings bool) (i int32, leaf bool) {
	unit := p.alloc.Round(o.Length)
	i = p.t.add(o.Key, o.Offset, o.Length, unit)
	r := &p.t.recs[i]
	live := o.Live && o.Write
	switch {
	case live:
		// A carried transfer's reservation: in the index, write-locked,
		// for the worker's commit to publish once ClaimWrites hands it
		// over; never readable before.
		r.carried = true
		ad.Carried++
		if p.obs != nil {
			p.obs.Stored(&o.Key, unit)
		}
	case o.Held:
		p.t.detach(i)
		r.doomed = true
		p.t.doomed++
		p.t.doomedBytes += unit
		ad.Held++
		ad.HeldBytes += unit
	default:
		ad.Objects++
		ad.Bytes += unit
		if p.obs != nil {
			p.obs.Stored(&o.Key, unit)
		}
	}
	switch {
	case o.Write:
		r.state = stateWrite
		p.t.writeLocked++
	case o.Readers > 0 || o.Holds > 0:
		r.readers, r.holds = o.Readers, o.Holds
		p.t.readLocked++
	}
	if o.Write || o.Readers > 0 || o.Holds > 0 {
		// The writers are gone with the previous process: their locks are
		// the abandoned owner's until their deadlines. Read locks are the
		// lookups', charged as a live lookup's are (the lookup cap).
		r.lock = p.newLock()
		r.deadline = o.Deadline
		owner := CarriedLookupOwner()
		if o.Write {
			owner = AbandonedOwner()
		}
		r.owner = p.charge(owner, unit)
		p.t.locked[i] = struct{}{}
	}
	if live || o.Holds > 0 {
		if p.claimable == nil {
			p.claimable = make(map[int64]int32)
		}
		p.claimable[o.Offset] = i
	}
	switch {
	case live:
		if rings {
			p.joinRing(i) // as a reservation made here: on the heap once published
		}
	case !o.Held:
		// A leaf until restoreLinks links its children to it: its gap is
		// lent now, as a push into the heaps would lend it (the links
		// read it), and restore puts the leaves left in the heaps.
		if rings {
			p.joinRing(i)
		}
		p.t.adoptOrder(i, o, base)
		if p.t.candidate(i) {
			nextuse.LendPrior(&r.ord, p.t.clk.Prior(p.t.len()))
			return i, true
		}
	}
	return i, false
}
