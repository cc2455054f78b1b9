package l1

import (
	"errors"
	"fmt"

	"kvdock/core/keys"
	"kvdock/core/l1/alloc"
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
			Held: r.doomed || r.detached || r.state == stateWrite, Write: r.state == stateWrite}
		if locked {
			o.Readers, o.Holds, o.Deadline = r.readers, r.holds, r.deadline
		}
		k.Objects = append(k.Objects, o)
	}
	return k
}

// keyOf is record i's key.
func (p *Pool) keyOf(i int32) keys.ObjectKey {
	id := p.t.recs[i].id
	n := p.t.nameList[id.name]
	return keys.ObjectKey{Chunk: id.chunk, Model: n.model, Salt: n.salt, KVRank: id.rank, Group: id.group}
}

// Adopt opens a pool over the kept segment k instead of creating one, and
// restores its table: published objects are readable again, with the read
// locks they had (until their deadlines); held objects keep their bytes
// for their holders, never readable, until their deadlines; objects whose
// deadline has passed give their bytes back. opts must give the kept
// geometry (Size, Align), and opts.Plan the kind of segment: a private
// segment is adopted only for a private plan (under its kept name, as an
// auto segment is), a shared one only for a plan that is not private, so a
// private pool is never advertised and a shared one never hidden. Nothing of k is trusted:
// the segment must be the recorded file (segment.Adopt), and the objects
// must lie aligned inside the pool without overlapping and name each
// published key once; otherwise nothing is adopted and the error (wrapping
// ErrNotAdoptable, or ErrSegmentBusy when a live process holds the
// segment) says why.
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
	seg, err := segment.Adopt(opts.ShmDir, k.Segment, opts.Size, prefault, p.log)
	if err != nil {
		_ = p.Close()
		return nil, Adopted{}, fmt.Errorf("l1: %w", err)
	}
	_ = p.seg.Close() // the untouched anonymous memory
	p.seg = seg
	return p, ad, nil
}

// restore rebuilds the allocator and the table from k; on error the pool
// is left empty.
func (p *Pool) restore(k Kept, ad *Adopted) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	live := make([]KeptObject, 0, len(k.Objects))
	for _, o := range k.Objects {
		if (o.Held || o.Readers > 0 || o.Holds > 0) && o.Deadline <= now {
			ad.Expired++
			if o.Held {
				continue
			}
			o.Readers, o.Holds, o.Deadline = 0, 0, 0
		}
		live = append(live, o)
	}
	used := make([]alloc.Extent, len(live))
	for i, o := range live {
		used[i] = alloc.Extent{Off: o.Offset, Size: o.Length}
	}
	if err := p.alloc.Carve(used); err != nil {
		return fmt.Errorf("%w: %v", ErrNotAdoptable, err)
	}
	// Held records first: they leave the key index at once, so a published
	// record of the same key finds its key free.
	for _, held := range []bool{true, false} {
		for _, o := range live {
			if o.Held != held {
				continue
			}
			if !held && p.t.find(o.Key) != nilRec {
				p.alloc.Reset()
				p.t.init()
				return fmt.Errorf("%w: key %s recorded twice", ErrNotAdoptable, o.Key)
			}
			p.adoptObject(o, ad)
		}
	}
	return nil
}

// adoptObject adds one recorded object; p.mu is held and its bytes are
// carved out of the allocator.
func (p *Pool) adoptObject(o KeptObject, ad *Adopted) {
	unit := p.alloc.Round(o.Length)
	i := p.t.add(o.Key, o.Offset, o.Length, unit)
	r := &p.t.recs[i]
	if o.Held {
		p.t.detach(i)
		r.doomed = true
		p.t.doomed++
		p.t.doomedBytes += unit
		ad.Held++
		ad.HeldBytes += unit
	} else {
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
		// The holders are gone with the previous process: their locks are
		// the abandoned owner's until their deadlines.
		r.lock = p.newLock()
		r.deadline = o.Deadline
		r.owner = p.charge(AbandonedOwner(), unit)
		p.t.locked[i] = struct{}{}
	}
	if !o.Held {
		// The prompt links are not recorded: under the prefix policy an
		// adopted object is a leaf of its own, evictable in its LRU turn.
		p.joinRing(i)
		p.t.reheap(i)
	}
}
