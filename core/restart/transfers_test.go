package restart

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// carrySample is sample() with object 7 a live reservation, object 0 held
// by a worker's read, and one carried transfer of each kind.
func carrySample() Record {
	r := sample()
	r.Pool.Objects[7].Live = true
	r.Pool.Objects[0].Holds, r.Pool.Objects[0].Deadline = 1, time.Now().Add(time.Minute).UnixNano()
	r.CarryKey = bytes.Repeat([]byte{7}, CarryKeyBytes)
	r.Transfers = []Transfer{
		{Instance: 7, Write: true, WorldSize: 1, NTokens: 32, End: 32, Digest: [16]byte{1}, Created: time.Unix(100, 0), Offsets: []int64{7 * 8192}},
		{Instance: 7, WorldSize: 1, NTokens: 32, End: 32, Digest: [16]byte{2}, Created: time.Unix(100, 0), Readers: 1, Offsets: []int64{0}},
	}
	r.Handover = Handover{Parked: 3, Lost: 1}
	return r
}

// TestRecordCarriesTransfers: the carried transfers, their key and the
// handover's counts come back exactly.
func TestRecordCarriesTransfers(t *testing.T) {
	want := carrySample()
	b, err := Encode(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Transfers) != 2 || !bytes.Equal(got.CarryKey, want.CarryKey) || got.Handover != want.Handover || got.Dropped.N != 0 {
		t.Fatalf("got %d transfers, key %x, handover %+v, dropped %v", len(got.Transfers), got.CarryKey, got.Handover, got.Dropped.Reasons())
	}
	for i := range want.Transfers {
		w, g := want.Transfers[i], got.Transfers[i]
		if g.Instance != w.Instance || g.Write != w.Write || g.Digest != w.Digest || !g.Created.Equal(w.Created) ||
			g.Readers != w.Readers || len(g.Offsets) != 1 || g.Offsets[0] != w.Offsets[0] {
			t.Fatalf("transfer %d: got %+v, want %+v", i, g, w)
		}
	}
	if !got.Pool.Objects[7].Live {
		t.Fatal("the live reservation came back held only")
	}
}

// TestHostileCarriedTransfersDroppedAlone: a carried transfer that names
// objects it does not hold (a published object as a reservation, one
// reservation twice or for two transfers, an object that is not there, a
// read of an object no worker holds), or whose fields are out of range, is
// left out alone with the reason; without a carry key none is used; the
// rest of the record stands.
func TestHostileCarriedTransfersDroppedAlone(t *testing.T) {
	cases := map[string]struct {
		mutate func(*Record)
		want   string
		kept   int
	}{
		"published as a reservation": {func(r *Record) { r.Transfers[0].Offsets = []int64{8192} }, "not a reservation of its own", 1},
		"reservation twice":          {func(r *Record) { r.Transfers[0].Offsets = []int64{7 * 8192, 7 * 8192} }, "named twice", 1},
		"two transfers, one slot":    {func(r *Record) { r.Transfers = append(r.Transfers, r.Transfers[0]) }, "not a reservation of its own", 2},
		"no object":                  {func(r *Record) { r.Transfers[1].Offsets = []int64{4096} }, "no object at 4096", 1},
		"read of an unheld object":   {func(r *Record) { r.Transfers[1].Offsets = []int64{8192} }, "not held by a reader", 1},
		"no readers":                 {func(r *Record) { r.Transfers[1].Readers = 0 }, "0 readers", 1},
		"future":                     {func(r *Record) { r.Transfers[0].Created = time.Unix(200, 0) }, "prepared at", 1},
		"range":                      {func(r *Record) { r.Transfers[0].Start, r.Transfers[0].End = 32, 16 }, "key fields out of range", 1},
		"no objects":                 {func(r *Record) { r.Transfers[1].Offsets = nil }, "0 objects", 1},
		"short key":                  {func(r *Record) { r.CarryKey = r.CarryKey[:8] }, "without their key", 0},
	}
	for name, tc := range cases {
		r := carrySample()
		tc.mutate(&r)
		b, err := Encode(r)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Errorf("%s: the whole record refused: %v", name, err)
			continue
		}
		reasons := strings.Join(got.Dropped.Reasons(), "; ")
		if len(got.Transfers) != tc.kept || !strings.Contains(reasons, tc.want) || len(got.Pool.Objects) != 8 || len(got.Registrations) != 1 {
			t.Errorf("%s: %d transfers kept (%s), %d objects, %d registrations; want %d kept saying %q",
				name, len(got.Transfers), reasons, len(got.Pool.Objects), len(got.Registrations), tc.kept, tc.want)
		}
	}
}
