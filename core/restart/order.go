package restart

import (
	"encoding/json"
	"fmt"

	"kvdock/core/l1"
)

// The prefix policy's order (l1.KeptObject's Age, Gap and Measured, and
// the pool's mean gap) travels beside the objects, three numbers an object,
// a block of its own decoded apart from the rest like the links: a block
// that does not parse or does not cover the objects one to one is left out
// with the reason, and the pool is adopted in its table's order. The
// figures only order evictions (l1 bounds them), never decide a byte.

// orderBlock is the wire form: per object [age, gap, measured (0 or 1)].
type orderBlock struct {
	Mean    uint64      `json:"mean_gap"`
	Objects [][3]uint64 `json:"objects"`
}

// encodeOrder renders the order of k, nil when no object has one.
func encodeOrder(k l1.Kept) json.RawMessage {
	b := orderBlock{Mean: k.MeanGap, Objects: make([][3]uint64, len(k.Objects))}
	some := false
	for i, o := range k.Objects {
		m := uint64(0)
		if o.Measured {
			m = 1
		}
		b.Objects[i] = [3]uint64{o.Age, o.Gap, m}
		some = some || o.Age != 0 || o.Gap != 0
	}
	if !some {
		return nil
	}
	js, _ := json.Marshal(b) // integers always marshal
	return js
}

// decodeOrder sets the order of objs and the mean gap of k from raw and
// returns what it left out, with the reason ("" when nothing); n and from
// are decodeLinks's.
func decodeOrder(raw json.RawMessage, parsed *orderBlock, n int, from []int, k *l1.Kept) string {
	if len(raw) == 0 {
		return ""
	}
	if max := blockBytes(n, orderBytes); len(raw) > max {
		return fmt.Sprintf("eviction order left out: %d bytes for %d objects (at most %d)", len(raw), n, max)
	}
	var b orderBlock
	ok := parsed != nil
	if ok {
		b = *parsed
	} else {
		b, ok = parseOrder(raw)
	}
	if !ok {
		b = orderBlock{}
		if err := json.Unmarshal(raw, &b); err != nil {
			return fmt.Sprintf("eviction order left out: %v", err)
		}
	}
	if len(b.Objects) != n {
		return fmt.Sprintf("eviction order left out: %d for %d objects", len(b.Objects), n)
	}
	for _, v := range b.Objects {
		if v[2] > 1 {
			return fmt.Sprintf("eviction order left out: measured %d, want 0 or 1", v[2])
		}
	}
	for j, i := range from {
		v := b.Objects[i]
		k.Objects[j].Age, k.Objects[j].Gap, k.Objects[j].Measured = v[0], v[1], v[2] == 1
	}
	k.MeanGap = b.Mean
	return ""
}

// parseOrder reads the form encodeOrder writes ({"mean_gap":n,"objects":
// [[a,g,m],…]}, no whitespace) in one pass, where encoding/json reflects
// over every entry; ok is false for anything else, which json.Unmarshal
// judges.
func parseOrder(raw []byte) (orderBlock, bool) {
	b, n, ok := parseOrderAt(raw)
	return b, ok && n == len(raw)
}

// parseOrderAt reads an order block in the canonical form at the start of
// raw and returns how many bytes it took.
func parseOrderAt(raw []byte) (orderBlock, int, bool) {
	p := objectParser{b: raw}
	var b orderBlock
	p.lit(`{"mean_gap":`)
	b.Mean = p.unsigned(64)
	p.lit(`,"objects":[`)
	// Each entry takes 8 bytes at least; no record holds more than
	// MaxObjects (Decode refuses a block that does not cover its objects).
	b.Objects = make([][3]uint64, 0, min(len(raw)/8, MaxObjects+1))
	for !p.bad && !p.opt("]") {
		if len(b.Objects) > 0 {
			p.lit(",")
		}
		if len(b.Objects) > MaxObjects {
			return orderBlock{}, 0, false // json.Unmarshal says so, counted as left out
		}
		var v [3]uint64
		p.lit("[")
		v[0] = p.unsigned(64)
		p.lit(",")
		v[1] = p.unsigned(64)
		p.lit(",")
		v[2] = p.unsigned(64)
		p.lit("]")
		b.Objects = append(b.Objects, v)
	}
	p.lit("}")
	return b, p.i, !p.bad
}
