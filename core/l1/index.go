package l1

import (
	"encoding/binary"

	"kvdock/core/keys"
)

// keyIndex finds a record by its identity: open addressing with linear
// probing over record indices, at most half full. A slot is 4 bytes where a
// Go map would keep a copy of the 44-byte identity and its value in every
// slot (about 100 bytes an object at a million objects), which leaves the
// per-object budget room for the prefix tree's links.
type keyIndex struct {
	slots []int32 // record index + 1; 0 = empty; a power of two long
	n     int
}

// identHash spreads an identity over the slots: the digest is uniform
// already, the rest is mixed in (splitmix64's finaliser).
func identHash(id *ident) uint64 {
	return keys.Mix64(binary.LittleEndian.Uint64(id.chunk[:8]) ^ uint64(id.name)<<32 ^ uint64(id.rank)*0x9e3779b97f4a7c15 ^ uint64(id.group)<<48)
}

// find returns the record holding id, or nilRec.
func (x *keyIndex) find(recs []record, id *ident) int32 {
	if x.n == 0 {
		return nilRec
	}
	mask := uint64(len(x.slots) - 1)
	for h := identHash(id) & mask; ; h = (h + 1) & mask {
		e := x.slots[h]
		if e == 0 {
			return nilRec
		}
		if recs[e-1].id == *id {
			return e - 1
		}
	}
}

// insert adds record i, whose identity is absent.
func (x *keyIndex) insert(recs []record, i int32) {
	if 2*(x.n+1) > len(x.slots) {
		x.grow(recs)
	}
	x.put(recs, i)
	x.n++
}

func (x *keyIndex) put(recs []record, i int32) {
	mask := uint64(len(x.slots) - 1)
	h := identHash(&recs[i].id) & mask
	for x.slots[h] != 0 {
		h = (h + 1) & mask
	}
	x.slots[h] = i + 1
}

// grow doubles the slots and re-inserts every entry.
func (x *keyIndex) grow(recs []record) {
	old := x.slots
	x.slots = make([]int32, max(64, 2*len(old)))
	for _, e := range old {
		if e != 0 {
			x.put(recs, e-1)
		}
	}
}

// remove drops record i, which is in the index.
func (x *keyIndex) remove(recs []record, i int32) {
	mask := uint64(len(x.slots) - 1)
	h := identHash(&recs[i].id) & mask
	for x.slots[h] != i+1 {
		h = (h + 1) & mask
	}
	// Backward-shift deletion keeps every probe chain unbroken.
	x.slots[h] = 0
	for j, k := h, (h+1)&mask; x.slots[k] != 0; k = (k + 1) & mask {
		home := identHash(&recs[x.slots[k]-1].id) & mask
		// The entry at k stays unless its home lies cyclically in (j, k].
		if (j <= k && (home <= j || home > k)) || (j > k && home <= j && home > k) {
			x.slots[j], x.slots[k] = x.slots[k], 0
			j = k
		}
	}
	x.n--
}
