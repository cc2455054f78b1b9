package restart

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"kvdock/core/l1"
)

func randomObjects(rng *rand.Rand, n int) objectList {
	l := make(objectList, n)
	for i := range l {
		l[i] = object{Chunk: strings.Repeat("0123456789abcdef", 4)[:rng.IntN(65)], Name: rng.IntN(9) - 1,
			Rank: rng.Uint32(), Group: rng.Uint32() % 3, Off: rng.Int64() - rng.Int64(), Len: rng.Int64N(1 << 40),
			Held: rng.IntN(2) == 0, Write: rng.IntN(2) == 0, Readers: rng.Uint32() % 4, Holds: rng.Uint32() % 3,
			Deadline: rng.Int64N(3) * rng.Int64(), Live: rng.IntN(2) == 0}
	}
	return l
}

// std decodes b as Decode read the table before objectList: encoding/json,
// unknown fields refused.
func std(b []byte) ([]object, error) {
	var objs []object
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	err := dec.Decode(&objs)
	return objs, err
}

// The hand-written table writes what encoding/json writes, and reads
// every form back as encoding/json reads it: the same values, or a refusal
// where encoding/json refuses.
func TestObjectListMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 50} {
		l := randomObjects(rng, n)
		got, _ := l.MarshalJSON()
		want, _ := json.Marshal([]object(l))
		if string(got) != string(want) {
			t.Fatalf("%d objects: wrote\n%s\nencoding/json writes\n%s", n, got, want)
		}
		objs, ok := parseObjects(got)
		if !ok || !reflect.DeepEqual(objs, []object(l)) || (n > 0 && !reflect.DeepEqual(objs, []object(l))) {
			t.Fatalf("%d objects: the canonical form not read back by the fast path (ok %v)", n, ok)
		}
	}
	canon := `[{"c":"ab","n":1,"r":2,"g":0,"o":4096,"l":10,"w":true,"d":5}]`
	for _, in := range []string{
		canon,
		`[]`, `null`, ` []`, `[ ]`,
		`[{"c":"ab","n":1,"r":2,"g":0,"o":4096,"l":10,"w":true,"d":5,"x":1}]`, // unknown field
		`[{"c":"ab","n":1,"r":2,"g":0,"o":4096,"l":10,"d":5,"w":true}]`,       // other order
		`[{"c":"ab","n":1,"n":2,"r":2,"g":0,"o":4096,"l":10}]`,                // repeated field
		`[{"c":"a\u0062","n":1,"r":2,"g":0,"o":4096,"l":10}]`,                 // an escape
		`[{"c":"ab","n":01,"r":2,"g":0,"o":4096,"l":10}]`,                     // leading zero
		`[{"c":"ab","n":1,"r":4294967296,"g":0,"o":4096,"l":10}]`,             // past uint32
		`[{"c":"ab","n":1,"r":-1,"g":0,"o":4096,"l":10}]`,                     // negative unsigned
		`[{"c":"ab","n":1,"r":2,"g":0,"o":9223372036854775808,"l":10}]`,       // past int64
		`[{"c":"ab","n":1,"r":2,"g":0,"o":-0,"l":10}]`,                        // minus zero
		`[{"c":"ab","n":1,"r":2,"g":0,"o":1e3,"l":10}]`,                       // an exponent
		`[{"c":"ab","n":1,"r":2,"g":0,"o":4096,"l":10},]`,                     // trailing comma
		`[{"c":"ab","n":1,"r":2,"g":0,"o":4096,"l":10}`,                       // truncated
		`[{"c":"ab","n":1,"r":2,"g":0,"o":4096,"l":10}] `,                     // trailing space
		`[{"c":"ab","n":1,"r":2,"g":0,"o":4096,"l":10,"h":false}]`,            // an explicit false
		`[{"n":1,"r":2,"g":0,"o":4096,"l":10}]`,                               // a field missing
		`[{"c":"ab","n":1,"r":2,"g":0,"o":4096,"l":10,"rd":4294967295,"lv":true}]`,
	} {
		want, werr := std([]byte(in))
		if objs, ok := parseObjects([]byte(in)); ok && (werr != nil || !reflect.DeepEqual(objs, want)) {
			t.Errorf("%s: the fast path read %+v, encoding/json %+v (%v)", in, objs, want, werr)
		}
		var l objectList
		err := l.UnmarshalJSON([]byte(in))
		if (err != nil) != (werr != nil) || (err == nil && !reflect.DeepEqual([]object(l), want) && len(want)+len(l) > 0) {
			t.Errorf("%s: read %+v (%v), encoding/json %+v (%v)", in, l, err, want, werr)
		}
	}
}

// FuzzObjectList: whatever the fast path accepts, encoding/json reads to
// the same values.
func FuzzObjectList(f *testing.F) {
	l := randomObjects(rand.New(rand.NewPCG(3, 4)), 3)
	b, _ := l.MarshalJSON()
	f.Add(b)
	f.Add([]byte(`[{"c":"ab","n":1,"r":2,"g":0,"o":4096,"l":10,"w":true,"d":5}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		objs, ok := parseObjects(b)
		if !ok {
			return
		}
		want, err := std(b)
		if err != nil || !reflect.DeepEqual(objs, want) && len(objs)+len(want) > 0 {
			t.Fatalf("%q: fast %+v, encoding/json %+v (%v)", b, objs, want, err)
		}
	})
}

// The body with its table put in place is the body encoding/json writes.
func TestMarshalBodyMatchesEncodingJSON(t *testing.T) {
	b := body{Build: "b\x00\"objects\":[]", Endpoint: "h:1", Names: []name{{Model: `"objects":[]`, Salt: "\xff"}},
		Objects: randomObjects(rand.New(rand.NewPCG(5, 6)), 20), Stats: json.RawMessage(`{"objects":[]}`)}
	got, err := marshalBody(b)
	if err != nil {
		t.Fatal(err)
	}
	plain := b
	plain.Objects = nil
	type wire body // encoding/json over the same fields, without the table's methods
	want, _ := json.Marshal(struct {
		wire
		Objects []object `json:"objects"`
	}{wire(plain), b.Objects})
	var g, w map[string]any
	if json.Unmarshal(got, &g) != nil || json.Unmarshal(want, &w) != nil || !reflect.DeepEqual(g, w) {
		t.Fatalf("body\n%s\nencoding/json\n%s", got, want)
	}
	var back body
	if err := json.Unmarshal(got, &back); err != nil || !reflect.DeepEqual([]object(back.Objects), []object(b.Objects)) {
		t.Fatalf("read back: %v", err)
	}
}

// The links' fast path reads what json.Unmarshal reads, or leaves the
// block to it.
func TestParseLinksMatchesEncodingJSON(t *testing.T) {
	for _, in := range []string{`[]`, `[0,-1,3]`, `[1]`, `[01]`, `[1,]`, `[ 1]`, `[1e2]`, `[9223372036854775808]`, `[-]`, `[1`, `null`, `[1,2] `} {
		var want []int64
		werr := json.Unmarshal([]byte(in), &want)
		if got, ok := parseLinks([]byte(in)); ok && (werr != nil || !reflect.DeepEqual(got, want) && len(got)+len(want) > 0) {
			t.Errorf("%s: fast %v, encoding/json %v (%v)", in, got, want, werr)
		}
	}
}

// The order's fast path reads what json.Unmarshal reads, or leaves the
// block to it; what encodeOrder writes it reads back exactly.
func TestParseOrderMatchesEncodingJSON(t *testing.T) {
	for _, in := range []string{`{"mean_gap":5,"objects":[]}`, `{"mean_gap":0,"objects":[[1,2,0],[3,4,1]]}`,
		`{"mean_gap":5,"objects":[[1,2]]}`, `{"mean_gap":5,"objects":[[1,2,3,4]]}`, `{"mean_gap":5,"objects":[[01,2,0]]}`,
		`{"mean_gap":-1,"objects":[]}`, `{"mean_gap":5, "objects":[]}`, `{"objects":[],"mean_gap":5}`,
		`{"mean_gap":5,"objects":[[1,2,0],]}`, `{"mean_gap":18446744073709551616,"objects":[]}`,
		`{"mean_gap":5,"objects":null}`, `{"mean_gap":5,"objects":[[1,2,0]]} `, `{"mean_gap":5,"objects":[[1,2,0]]`, `null`} {
		var want orderBlock
		werr := json.Unmarshal([]byte(in), &want)
		if got, ok := parseOrder([]byte(in)); ok && (werr != nil || !reflect.DeepEqual(got, want) && len(got.Objects)+len(want.Objects) > 0) {
			t.Errorf("%s: fast %+v, encoding/json %+v (%v)", in, got, want, werr)
		}
	}
	r := rand.New(rand.NewPCG(7, 8))
	k := l1.Kept{MeanGap: r.Uint64()}
	for range 200 {
		k.Objects = append(k.Objects, l1.KeptObject{Age: r.Uint64() >> r.IntN(64), Gap: r.Uint64() >> r.IntN(64), Measured: r.IntN(2) == 0})
	}
	raw := encodeOrder(k)
	got, ok := parseOrder(raw)
	var want orderBlock
	if err := json.Unmarshal(raw, &want); !ok || err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("encodeOrder's block: fast path %v, encoding/json %v", ok, err)
	}
}
