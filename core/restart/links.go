package restart

import (
	"encoding/json"
	"fmt"

	"kvdock/core/l1"
)

// The kept table's prompt links travel beside the objects, one number an
// object: 0 none, -1 the object starts a prompt, k > 0 its parent is
// object k-1. They are a block of their own, decoded apart from the rest:
// a block that does not parse, or does not cover the objects one to one,
// is left out with the reason and the pool adopted without its links.
// Each link is checked again by l1.Adopt, which drops a bad one object by
// object.

// encodeLinks renders the links of objs, nil when there is none.
func encodeLinks(objs []l1.KeptObject) json.RawMessage {
	links := make([]int64, len(objs))
	some := false
	for i, o := range objs {
		switch {
		case o.Root:
			links[i], some = -1, true
		case o.Parent > 0:
			links[i], some = int64(o.Parent), true
		}
	}
	if !some {
		return nil
	}
	js, _ := json.Marshal(links) // a slice of integers always marshals
	return js
}

// decodeLinks sets the links of objs from raw and returns what it left
// out, with the reason ("" when nothing). raw covers the body's n objects;
// from gives each of objs its body index, so a link to an object Decode
// dropped is left out with it.
func decodeLinks(raw json.RawMessage, parsed []int64, n int, from []int, objs []l1.KeptObject) string {
	if len(raw) == 0 {
		return ""
	}
	if max := blockBytes(n, linkBytes); len(raw) > max {
		// Past what any writing of n links takes: encoding/json would
		// hold a slice as long as the block says.
		return fmt.Sprintf("prompt links left out: %d bytes for %d objects (at most %d)", len(raw), n, max)
	}
	links, ok := parsed, parsed != nil
	if !ok {
		links, ok = parseLinks(raw)
	}
	if !ok {
		if err := json.Unmarshal(raw, &links); err != nil {
			return fmt.Sprintf("prompt links left out: %v", err)
		}
	}
	if len(links) != n {
		return fmt.Sprintf("prompt links left out: %d for %d objects", len(links), n)
	}
	at := make(map[int]int, len(from)) // body index -> index in objs
	for j, i := range from {
		at[i] = j
	}
	bad, gone := 0, 0
	for j, i := range from {
		switch v := links[i]; {
		case v == -1:
			objs[j].Root = true
		case v > 0 && v <= int64(n):
			if p, ok := at[int(v-1)]; ok {
				objs[j].Parent = p + 1
			} else {
				gone++
			}
		case v != 0:
			bad++
		}
	}
	switch {
	case bad > 0:
		return fmt.Sprintf("%d prompt link(s) left out: they name no object of the %d", bad, n)
	case gone > 0:
		return fmt.Sprintf("%d prompt link(s) left out: their parents were left out of the record", gone)
	}
	return ""
}

// parseLinks reads the form encodeLinks writes ([n,n,…], no whitespace) in
// one pass; ok is false for anything else, which json.Unmarshal judges.
func parseLinks(raw []byte) ([]int64, bool) {
	out, n, ok := parseLinksAt(raw)
	return out, ok && n == len(raw)
}

// parseLinksAt reads a links block in the canonical form at the start of
// raw and returns how many bytes it took.
func parseLinksAt(raw []byte) ([]int64, int, bool) {
	p := objectParser{b: raw}
	p.lit("[")
	// Each link takes 2 bytes at least; no record holds more than
	// MaxObjects (Decode refuses a block that does not cover its objects).
	out := make([]int64, 0, min(len(raw)/2, MaxObjects+1))
	for !p.bad && !p.opt("]") {
		if len(out) > 0 {
			p.lit(",")
		}
		if len(out) > MaxObjects {
			return nil, 0, false
		}
		out = append(out, p.signed(64))
	}
	return out, p.i, !p.bad
}

// The most bytes one entry of a block takes in the JSON text, with its
// separator and as much whitespace again: a link (-9223372036854775808,),
// an order entry ([a,g,m], three uint64s).
const (
	linkBytes  = 2 * 21
	orderBytes = 2 * (3*20 + 4)
)

// blockBytes bounds a per-object block of n entries of at most per bytes
// each, with room for its frame.
func blockBytes(n, per int) int { return n*per + 256 }
