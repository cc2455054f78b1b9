package restart

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"kvdock/core/misses"
	"kvdock/core/series"
)

// withView is sample() with prompt links (object 0 starts a prompt, 1 to 3
// follow it) and the operator's figures, peer strings of invalid UTF-8
// included.
func withView() Record {
	r := sample()
	r.Pool.Objects[0].Root = true
	for i := 1; i < 4; i++ {
		r.Pool.Objects[i].Parent = i // object i-1
	}
	r.Pool.Objects[5].Root = true
	for i := range r.Pool.Objects {
		r.Pool.Objects[i].Age, r.Pool.Objects[i].Gap, r.Pool.Objects[i].Measured = uint64(10*i+1), uint64(7+i), i%2 == 0
	}
	r.Pool.MeanGap = 42
	var mc misses.Counts
	mc[misses.Evicted], mc[misses.NeverStored] = 5, 2
	r.Stats = &Stats{Since: time.Unix(40, 0), ResetAt: time.Unix(60, 0), Taken: time.Unix(100, 3), TokensSavedTotal: 123456,
		Series: []Series{
			{Name: "hit_chunks", State: series.State{Fine: []float64{1, 2.5, 0}, Coarse: []float64{0.25}, Pending: 3}},
			{Name: "lookups", State: series.State{Fine: []float64{4}, Coarse: []float64{}, Pending: 1}},
		},
		Misses: Misses{Total: MissCounts{Missed: mc, TierMissed: 1},
			Contexts: []MissCounts{{Model: "m\xff\xfe", WorldSize: 2, Missed: mc, TierMissed: 1}}},
		Events: []Event{
			{Time: time.Unix(90, 0), Kind: "lifecycle", Level: 0, Message: "registered m\xff"},
			{Time: time.Unix(95, 0), Kind: "error", Level: 8, Message: "boom"},
		}}
	return r
}

func TestRecordCarriesLinksAndStats(t *testing.T) {
	want := withView()
	data, err := Encode(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Ignored) != 0 {
		t.Fatalf("ignored %q", got.Ignored)
	}
	for i, o := range got.Pool.Objects {
		if o.Parent != want.Pool.Objects[i].Parent || o.Root != want.Pool.Objects[i].Root {
			t.Fatalf("object %d: parent %d root %v, want %d %v", i, o.Parent, o.Root, want.Pool.Objects[i].Parent, want.Pool.Objects[i].Root)
		}
		if w := want.Pool.Objects[i]; o.Age != w.Age || o.Gap != w.Gap || o.Measured != w.Measured {
			t.Fatalf("object %d: order %d %d %v, want %d %d %v", i, o.Age, o.Gap, o.Measured, w.Age, w.Gap, w.Measured)
		}
	}
	if got.Pool.MeanGap != 42 {
		t.Fatalf("mean gap %d, want 42", got.Pool.MeanGap)
	}
	if fmt.Sprintf("%+v", *got.Stats) != fmt.Sprintf("%+v", *want.Stats) {
		t.Fatalf("statistics:\n got %+v\nwant %+v", *got.Stats, *want.Stats)
	}
	// Peer strings come back byte for byte, not through UTF-8.
	if got.Stats.Misses.Contexts[0].Model != "m\xff\xfe" || got.Stats.Events[0].Message != "registered m\xff" {
		t.Fatalf("strings changed: %q %q", got.Stats.Misses.Contexts[0].Model, got.Stats.Events[0].Message)
	}
	// A record without them (an older build's) has none.
	plain, _ := Encode(sample())
	if r, err := Decode(plain); err != nil || r.Stats != nil || len(r.Ignored) != 0 {
		t.Fatalf("plain record: %+v %v", r.Stats, err)
	}
}

// hostileView is hostileBody for withView().
func hostileView(t *testing.T, mutate func(string) string) []byte {
	t.Helper()
	data, err := Encode(withView())
	if err != nil {
		t.Fatal(err)
	}
	nl := bytes.IndexByte(data, '\n')
	body := string(data[nl+1:])
	changed := mutate(body)
	if changed == body {
		t.Fatal("the mutation changed nothing")
	}
	return withHeader(changed)
}

// TestHostileRecordLinksAndStats: bad prompt links or figures never cost
// the pool: the record is adopted, the bad part alone is left out with
// its reason, and the rest of the figures are kept.
func TestHostileRecordLinksAndStats(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(string) string
		reason string
		check  func(r Record) string
	}{
		{"links not a list", func(s string) string {
			return regexp.MustCompile(`"links":\[[-0-9,]*\]`).ReplaceAllString(s, `"links":"x"`)
		},
			"prompt links left out: json", func(r Record) string {
				if r.Pool.Objects[0].Root || r.Stats == nil {
					return "links kept, or the figures lost"
				}
				return ""
			}},
		{"links count", func(s string) string { return strings.Replace(s, `"links":[-1,`, `"links":[-1,0,`, 1) }, "prompt links left out: 9 for 8", func(r Record) string {
			if r.Pool.Objects[1].Parent != 0 || r.Pool.Objects[0].Root {
				return "links kept"
			}
			return ""
		}},
		{"link outside", func(s string) string { return strings.Replace(s, `"links":[-1,1,`, `"links":[-1,99,`, 1) }, "1 prompt link(s) left out", func(r Record) string {
			if r.Pool.Objects[1].Parent != 0 || r.Pool.Objects[2].Parent != 2 || !r.Pool.Objects[0].Root {
				return "the good links were not kept, or the bad one was"
			}
			return ""
		}},
		{"order count", func(s string) string {
			return strings.Replace(s, `"objects":[[1,7,1],`, `"objects":[[1,7,1],[1,1,1],`, 1)
		}, "eviction order left out: 9 for 8", func(r Record) string {
			if r.Pool.Objects[0].Age != 0 || r.Pool.MeanGap != 0 || !r.Pool.Objects[0].Root {
				return "order kept, or the links lost"
			}
			return ""
		}},
		{"order measured", func(s string) string { return strings.Replace(s, `"objects":[[1,7,1],`, `"objects":[[1,7,2],`, 1) }, "eviction order left out: measured 2", nil},
		// Blocks longer than any writing of the record's 8 objects takes:
		// refused before encoding/json reads them (it would hold a slice as
		// long as they say).
		{"links too long", func(s string) string {
			return strings.Replace(s, `"links":[-1,`, `"links":[-1,`+strings.Repeat("0,", 400), 1)
		}, "prompt links left out: 819 bytes for 8 objects (at most 592)", nil},
		{"order too long", func(s string) string {
			return strings.Replace(s, `"objects":[[1,7,1],`, `"objects":[[1,7,1],`+strings.Repeat("[0,0,0],", 200), 1)
		}, "bytes for 8 objects (at most 1280)", nil},
		{"stats of the wrong type", func(s string) string { return strings.Replace(s, `"stats":{`, `"stats":{"since_ns":"x",`, 1) }, "statistics left out", func(r Record) string {
			if r.Stats != nil {
				return "statistics kept"
			}
			return ""
		}},
		{"since in the future", func(s string) string {
			return strings.Replace(s, `"since_ns":40000000000`, `"since_ns":999000000000`, 1)
		}, "statistics left out: since", nil},
		{"negative tokens", func(s string) string { return strings.Replace(s, `"tokens_saved":123456`, `"tokens_saved":-1`, 1) }, "tokens saved", nil},
		{"negative point", func(s string) string { return strings.Replace(s, `"fine":[1,2.5,0]`, `"fine":[1,-2.5,0]`, 1) }, `series 0 ("hit_chunks") left out`, func(r Record) string {
			if len(r.Stats.Series) != 1 || r.Stats.Series[0].Name != "lookups" || r.Stats.TokensSavedTotal != 123456 {
				return "the other figures were not kept"
			}
			return ""
		}},
		{"pending", func(s string) string { return strings.Replace(s, `"pending":3`, `"pending":50`, 1) }, "50 pending points", nil},
		{"too many points", func(s string) string {
			return strings.Replace(s, `"coarse":[0.25]`, `"coarse":[0.25`+strings.Repeat(",1", series.CoarseLen)+`]`, 1)
		}, "coarse points, at most", nil},
		{"same name twice", func(s string) string { return strings.Replace(s, `"name":"lookups"`, `"name":"hit_chunks"`, 1) }, "a second series", nil},
		{"miss reasons", func(s string) string {
			return strings.Replace(s, `"c":[2,5,0,0,0,0,0],"l2":1}]`, `"c":[2,5],"l2":1}]`, 1)
		}, "miss context 0 left out", func(r Record) string {
			if len(r.Stats.Misses.Contexts) != 0 || r.Stats.Misses.Total.Missed[misses.Evicted] != 5 {
				return "the context was kept, or the total was not"
			}
			return ""
		}},
		{"event time", func(s string) string { return strings.Replace(s, `"t":95000000000`, `"t":-1`, 1) }, "event 1 left out", func(r Record) string {
			if len(r.Stats.Events) != 1 || r.Stats.Events[0].Message != "registered m\xff" {
				return "the good event was not kept, or the bad one was"
			}
			return ""
		}},
		{"event level", func(s string) string { return strings.Replace(s, `"l":8`, `"l":99999`, 1) }, "event 1 left out", nil},
	}
	for _, tc := range cases {
		r, err := Decode(hostileView(t, tc.mutate))
		if err != nil {
			t.Errorf("%s: the record was refused (%v): the pool and registrations lost for a bad figure", tc.name, err)
			continue
		}
		if len(r.Pool.Objects) != 8 || len(r.Registrations) != 1 {
			t.Errorf("%s: pool or registrations changed: %d objects, %d registrations", tc.name, len(r.Pool.Objects), len(r.Registrations))
		}
		if !strings.Contains(strings.Join(r.Ignored, "; "), tc.reason) {
			t.Errorf("%s: ignored %q, want a reason saying %q", tc.name, r.Ignored, tc.reason)
		}
		if tc.check != nil {
			if msg := tc.check(r); msg != "" {
				t.Errorf("%s: %s", tc.name, msg)
			}
		}
	}
	// Past its bound a list is cut, not the record refused.
	r := withView()
	for range MaxEvents + 5 {
		r.Stats.Events = append(r.Stats.Events, Event{Time: time.Unix(96, 0), Kind: "k", Message: "x"})
	}
	data, err := Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(data)
	if err != nil || len(got.Stats.Events) != MaxEvents || !strings.Contains(strings.Join(got.Ignored, ";"), "events, at most") {
		t.Fatalf("%d events kept (%v), ignored %q", len(got.Stats.Events), err, got.Ignored)
	}
	if errors.Is(err, ErrInvalid) {
		t.Fatal("refused")
	}
}
