package restart

import (
	"fmt"
	"slices"
	"time"

	"kvdock/core/l1"
)

// Bounds of the carried transfers: a handover stop carries those its last
// answers began, a few per worker; what passes a bound is left out.
const (
	MaxTransfers        = 1 << 14
	MaxTransferObjects  = 1 << 16
	CarryKeyBytes       = 32
	maxTransferReadersN = 1 << 10
)

// Transfer is a prepared store (Write) or retrieve whose commit has not
// come: the instance it belongs to, its key as the transfer module matches
// a commit to it (the key's fields but the request id, the tokens and the
// salt hashed with the record's CarryKey), when it was prepared, how many
// answered prepares of a retrieve wait for their commits, and the objects
// it holds by offset (write reservations, or published objects it holds
// read-locked).
type Transfer struct {
	Instance                                      int64
	Write                                         bool
	WorldSize, Worker, NTokens, Start, End, NSalt int
	Digest                                        [16]byte
	Created                                       time.Time
	Readers                                       int
	Offsets                                       []int64
}

type transfer struct {
	Instance  int64   `json:"i"`
	Write     bool    `json:"w,omitempty"`
	WorldSize int     `json:"ws"`
	Worker    int     `json:"wk"`
	NTokens   int     `json:"nt"`
	Start     int     `json:"s"`
	End       int     `json:"e"`
	NSalt     int     `json:"ns"`
	Digest    []byte  `json:"h"`
	Created   int64   `json:"t"`
	Readers   int     `json:"r,omitempty"`
	Offsets   []int64 `json:"o"`
}

func encodeTransfers(ts []Transfer) []transfer {
	out := make([]transfer, 0, len(ts))
	for _, t := range ts {
		out = append(out, transfer{Instance: t.Instance, Write: t.Write, WorldSize: t.WorldSize, Worker: t.Worker,
			NTokens: t.NTokens, Start: t.Start, End: t.End, NSalt: t.NSalt, Digest: t.Digest[:],
			Created: t.Created.UnixNano(), Readers: t.Readers, Offsets: t.Offsets})
	}
	return out
}

// transfers returns the usable carried transfers: each one bounded, its
// objects those of the record (a write's are live reservations, a read's
// published objects with holds), no object claimed by two; a bad one is
// left out alone. Without a valid CarryKey none is usable.
func (b *body) transfers(objs []l1.KeptObject, d *l1.Drops) ([]Transfer, []byte) {
	if len(b.Transfers) == 0 {
		return nil, nil
	}
	if len(b.CarryKey) != CarryKeyBytes {
		d.AddN("carried transfers without their key", len(b.Transfers), fmt.Sprintf("a %d-byte key, want %d", len(b.CarryKey), CarryKeyBytes))
		return nil, nil
	}
	ts := b.Transfers
	if len(ts) > MaxTransfers {
		d.AddN("carried transfers past the bound", len(ts)-MaxTransfers, fmt.Sprintf("%d transfers, at most %d", len(ts), MaxTransfers))
		ts = ts[:MaxTransfers]
	}
	byOff := make(map[int64]*l1.KeptObject, len(objs))
	for i := range objs {
		byOff[objs[i].Offset] = &objs[i]
	}
	used := map[int64]bool{}
	var out []Transfer
	total := 0
	for i, t := range ts {
		why := ""
		switch {
		case len(t.Digest) != 16:
			why = fmt.Sprintf("a %d-byte key hash", len(t.Digest))
		case len(t.Offsets) == 0 || total+len(t.Offsets) > MaxTransferObjects:
			why = fmt.Sprintf("%d objects (at most %d in all)", len(t.Offsets), MaxTransferObjects)
		case t.Created <= 0 || t.Created > b.WrittenAt:
			why = fmt.Sprintf("prepared at %d ns", t.Created)
		case t.WorldSize <= 0 || t.Worker < 0 || t.NTokens < 0 || t.Start < 0 || t.End < t.Start || t.NSalt < 0:
			why = "key fields out of range"
		case t.Readers < 0 || t.Readers > maxTransferReadersN || !t.Write && t.Readers == 0:
			why = fmt.Sprintf("%d readers", t.Readers)
		}
		if why == "" {
			why = offsetsFit(t, byOff, used)
		}
		if why != "" {
			d.Add("carried transfer invalid", fmt.Sprintf("transfer %d of instance %d: %s", i, t.Instance, why))
			continue
		}
		for _, off := range t.Offsets {
			if t.Write {
				used[off] = true
			}
		}
		total += len(t.Offsets)
		out = append(out, Transfer{Instance: t.Instance, Write: t.Write, WorldSize: t.WorldSize, Worker: t.Worker,
			NTokens: t.NTokens, Start: t.Start, End: t.End, NSalt: t.NSalt, Digest: [16]byte(t.Digest),
			Created: time.Unix(0, t.Created), Readers: t.Readers, Offsets: slices.Clone(t.Offsets)})
	}
	return out, slices.Clone(b.CarryKey)
}

// offsetsFit says why t's objects are not what it claims ("" when they
// are): a write names live reservations no other transfer names, a read
// published objects with holds.
func offsetsFit(t transfer, byOff map[int64]*l1.KeptObject, used map[int64]bool) string {
	mine := make(map[int64]bool, len(t.Offsets))
	for _, off := range t.Offsets {
		o := byOff[off]
		twice := mine[off]
		mine[off] = true
		switch {
		case o == nil:
			return fmt.Sprintf("no object at %d", off)
		case twice:
			return fmt.Sprintf("the object at %d named twice", off)
		case t.Write && (!o.Live || used[off]):
			return fmt.Sprintf("the object at %d is not a reservation of its own", off)
		case !t.Write && (o.Held || o.Holds == 0):
			return fmt.Sprintf("the object at %d is not held by a reader", off)
		}
	}
	return ""
}

// Handover counts what the stop's wire server handover did (rpc.Handover).
type Handover struct {
	Parked int64 `json:"parked"`
	Lost   int64 `json:"lost"`
}

// maxHandoverCount bounds each count read back: more requests than a stop
// could park.
const maxHandoverCount = 1 << 32

// bounded returns h, or zeros with the reason when a count is out of range.
func (h Handover) bounded(d *l1.Drops) Handover {
	if h.Parked < 0 || h.Lost < 0 || h.Parked > maxHandoverCount || h.Lost > maxHandoverCount {
		d.Add("handover counts out of range", fmt.Sprintf("parked %d, lost %d", h.Parked, h.Lost))
		return Handover{}
	}
	return h
}
