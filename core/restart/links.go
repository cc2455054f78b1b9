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
// out, with the reason ("" when nothing).
func decodeLinks(raw json.RawMessage, objs []l1.KeptObject) string {
	if len(raw) == 0 {
		return ""
	}
	var links []int64
	if err := json.Unmarshal(raw, &links); err != nil {
		return fmt.Sprintf("prompt links left out: %v", err)
	}
	if len(links) != len(objs) {
		return fmt.Sprintf("prompt links left out: %d for %d objects", len(links), len(objs))
	}
	bad := 0
	for i, v := range links {
		switch {
		case v == -1:
			objs[i].Root = true
		case v > 0 && v <= int64(len(objs)):
			objs[i].Parent = int(v)
		case v != 0:
			bad++
		}
	}
	if bad > 0 {
		return fmt.Sprintf("%d prompt link(s) left out: they name no object of the %d", bad, len(objs))
	}
	return ""
}
