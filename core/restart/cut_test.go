package restart

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// cutSample is sample with the blocks the cut reading takes: links, an
// eviction order and carried transfers' neighbours (lookups, stats).
func cutSample() Record {
	r := sample()
	for i := range r.Pool.Objects {
		o := &r.Pool.Objects[i]
		o.Age, o.Gap, o.Measured = uint64(3+i), uint64(10*i), i%2 == 0
		if i%4 == 0 {
			o.Root = true
		} else {
			o.Parent = i // the object before it, counted from 1
		}
	}
	r.Pool.MeanGap = 17
	r.Stats = &Stats{Since: time.Unix(90, 0)}
	return r
}

// body of Encode's output, the header cut off.
func encodedBody(t testing.TB, r Record) []byte {
	t.Helper()
	data, err := Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	return data[bytes.IndexByte(data, '\n')+1:]
}

// TestHostileDecodeCutMatchesStandard: the state file is outside input,
// and the cut reading a second reader of it. Encode's bodies are read the
// cut way, to the body the standard reading gives; and wherever the cut
// way reads a changed body (a byte changed, put in or taken out, a key
// doubled or in another case) it reads what the standard reading does,
// which the cut way otherwise leaves to say.
func TestHostileDecodeCutMatchesStandard(t *testing.T) {
	for _, r := range []Record{sample(), cutSample()} {
		js := encodedBody(t, r)
		cut, ok := decodeCut(js)
		if !ok {
			t.Fatalf("Encode's body not read the cut way:\n%s", js)
		}
		std, err := decodeStandard(js)
		if err != nil || !reflect.DeepEqual(cut, std) {
			t.Fatalf("cut reading %+v, standard %+v (%v)", cut, std, err)
		}
	}
	js := encodedBody(t, cutSample())
	if !bytes.Contains(js, []byte(`"links":[`)) || !bytes.Contains(js, []byte(`"order":{`)) {
		t.Fatalf("the sample has no links or order block:\n%s", js)
	}
	rng := rand.New(rand.NewPCG(36, 4))
	const alphabet = `{}[],:"\ 0123456789-aeflnrstuOLKxh` + "\u212a"
	cutRead, same := 0, 0
	for range 20000 {
		m := mutate(rng, js, alphabet)
		cut, ok := decodeCut(m)
		if !ok {
			continue
		}
		cutRead++
		std, err := decodeStandard(m)
		if err != nil {
			t.Fatalf("read the cut way, refused the standard way (%v):\n%s", err, m)
		}
		if !reflect.DeepEqual(cut, std) {
			t.Fatalf("the cut reading differs from the standard one:\ncut %+v\nstd %+v\n%s", cut, std, m)
		}
		if bytes.Equal(m, js) {
			same++
		}
	}
	t.Logf("%d of 20000 changed bodies read the cut way (%d unchanged)", cutRead, same)
	if cutRead-same < 100 {
		t.Errorf("only %d changed bodies read the cut way: the test tries little", cutRead-same)
	}
}

// mutate changes js once: a byte replaced, put in or taken out, a
// top-level key doubled, or a block's name in capitals.
func mutate(rng *rand.Rand, js []byte, alphabet string) []byte {
	m := bytes.Clone(js)
	pick := func() []byte {
		rs := []rune(alphabet)
		return []byte(string(rs[rng.IntN(len(rs))]))
	}
	switch op := rng.IntN(6); op {
	case 0:
		at := rng.IntN(len(m))
		return append(append(m[:at:at], pick()...), js[at+1:]...)
	case 1:
		at := rng.IntN(len(m) + 1)
		return append(append(m[:at:at], pick()...), js[at:]...)
	case 2:
		at := rng.IntN(len(m))
		return append(m[:at:at], js[at+1:]...)
	case 3: // a top-level member given twice
		for _, k := range []string{`"objects":`, `"links":`, `"order":`, `"names":`, `"pid":`} {
			if rng.IntN(2) == 0 {
				continue
			}
			at := bytes.Index(m, []byte(k))
			if at < 0 {
				continue
			}
			end := at + len(k)
			n, ok := skipValue(m[end:])
			if !ok {
				continue
			}
			member := string(m[at : end+n])
			return []byte(strings.Replace(string(m), "{", "{"+member+",", 1))
		}
		return m
	case 4: // a block's name in another case
		for _, k := range []string{`"objects":`, `"links":`, `"order":`} {
			if rng.IntN(2) == 0 {
				return bytes.Replace(m, []byte(k), []byte(strings.ToUpper(k)), 1)
			}
		}
		return m
	default: // a valid block in another form: whitespace
		at := bytes.Index(m, []byte(`,"`))
		if at < 0 {
			return m
		}
		return append(append(m[:at+1:at+1], ' '), js[at+1:]...)
	}
}

// The cut reading keeps the objects block's hand parser in charge of it:
// a table in another valid form goes the standard way (and reads the same).
func TestDecodeCutLeavesOtherFormsToTheStandardWay(t *testing.T) {
	js := encodedBody(t, cutSample())
	spaced := bytes.Replace(js, []byte(`{"c":`), []byte(`{ "c":`), 1)
	if _, ok := decodeCut(spaced); ok {
		t.Fatal("a table with whitespace read the cut way")
	}
	b, _, err := decodeBody(spaced)
	if err != nil || len(b.Objects) != len(cutSample().Pool.Objects) {
		t.Fatalf("the standard way: %v, %d objects", err, len(b.Objects))
	}
}

// FuzzDecodeCut: whatever the cut way reads, the standard way reads to the
// same body.
func FuzzDecodeCut(f *testing.F) {
	f.Add(encodedBody(f, cutSample()))
	f.Add(encodedBody(f, sample()))
	f.Add([]byte(`{"objects":[],"links":[-1],"order":{"mean_gap":1,"objects":[[1,2,0]]}}`))
	f.Fuzz(func(t *testing.T, js []byte) {
		cut, ok := decodeCut(js)
		if !ok {
			return
		}
		std, err := decodeStandard(js)
		if err != nil || !reflect.DeepEqual(cut, std) {
			t.Fatalf("%q: cut %+v, standard %+v (%v)", js, cut, std, err)
		}
	})
}
