package restart

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/protocol"
)

func sample() Record {
	r := Record{Build: "test", Generation: 3, PID: 42, Endpoint: "localhost:5555",
		StoppedAt: time.Unix(100, 5), WrittenAt: time.Unix(101, 0), Auto: true,
		Pool: l1.Kept{Segment: l1.SegmentIdentity{Name: "lmcache_l1_pool_42", Dev: 1, Ino: 2, Size: 1 << 20, UID: uint32(os.Geteuid())},
			Size: 1 << 20, Align: 4096}}
	for i := range 8 {
		k := keys.ObjectKey{Model: "m", KVRank: keys.KVRank(1, 0), Salt: fmt.Sprint(i % 2), Layout: uint64(i % 3)}
		k.Chunk[0] = byte(i)
		o := l1.KeptObject{Key: k, Offset: int64(i) * 8192, Length: 5000}
		if i == 7 {
			o.Held, o.Write, o.Deadline = true, true, time.Now().Add(time.Minute).UnixNano()
		}
		r.Pool.Objects = append(r.Pool.Objects, o)
	}
	r.Registrations = []Registration{{ID: 7, Mode: "SHM", Profile: "nongpu-v1", Registered: time.Unix(50, 0),
		Payload: protocol.RegisterPayload{InstanceID: 7, ModelName: "m", WorldSize: 1, BlockSize: 16, NumLayers: 2, HiddenDimSize: 8, DtypeStr: "float16"}}}
	r.Lookups = []Lookup{{RequestID: "req-1", HitChunks: 3, Created: time.Unix(99, 7)}}
	return r
}

func TestRecordRoundTrips(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	want := sample()
	if err := Write(dir, "x.state", want); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, "x.state"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode %v (%v), want 0600", st.Mode(), err)
	}
	if d, _ := os.Stat(dir); d.Mode().Perm() != 0o700 {
		t.Fatalf("state dir mode %v, want 0700", d.Mode())
	}
	got, err := Take(dir, "x.state")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
	}
	if _, err := Take(dir, "x.state"); !errors.Is(err, ErrNone) {
		t.Fatalf("second Take: %v, want ErrNone (consumed)", err)
	}
	if _, err := Take(filepath.Join(dir, "missing"), "x.state"); !errors.Is(err, ErrNone) {
		t.Fatalf("no dir: %v, want ErrNone", err)
	}
}

func TestMatchNamesEveryPoolChange(t *testing.T) {
	r := sample()
	w := Want{Endpoint: "localhost:5555", Auto: true, Size: 1 << 20, Align: 4096}
	if m := Match(r, w); m != "" {
		t.Fatalf("same pool: %s", m)
	}
	for name, ch := range map[string]func(*Want){
		"size": func(w *Want) { w.Size *= 2 }, "align": func(w *Want) { w.Align = 8192 },
		"named": func(w *Want) { w.Auto, w.Segment = false, "lmcache_l1_pool_x" }, "port": func(w *Want) { w.Endpoint = "localhost:1" },
	} {
		w2 := w
		ch(&w2)
		if Match(r, w2) == "" {
			t.Errorf("%s change adopted", name)
		}
	}
}

// TestHostileMatchRefusesAnotherSegmentName: a segment kept under one
// --shm-name is never adopted under another name, nor once the name is
// unset (auto naming): the workers map the segment by its name, and the
// new process advertises what its settings name.
func TestHostileMatchRefusesAnotherSegmentName(t *testing.T) {
	r := sample()
	r.Auto, r.Pool.Segment.Name = false, "lmcache_l1_pool_a"
	named := Want{Endpoint: "localhost:5555", Segment: "lmcache_l1_pool_a", Size: 1 << 20, Align: 4096}
	if m := Match(r, named); m != "" {
		t.Fatalf("the same name refused: %s", m)
	}
	other := named
	other.Segment = "lmcache_l1_pool_b"
	if m := Match(r, other); !strings.Contains(m, "lmcache_l1_pool_a") || !strings.Contains(m, "lmcache_l1_pool_b") {
		t.Fatalf("kept as lmcache_l1_pool_a, wanted as lmcache_l1_pool_b: %q, want a refusal naming both", m)
	}
	auto := named
	auto.Auto, auto.Segment = true, ""
	if m := Match(r, auto); !strings.Contains(m, "now unset") {
		t.Fatalf("kept under --shm-name, now auto: %q, want a refusal", m)
	}
}

// encode writes a record whose body was changed after validation would
// pass: mutate edits the JSON text, and the checksum is recomputed, as a
// hostile writer would.
func hostileBody(t *testing.T, mutate func(string) string) []byte {
	t.Helper()
	data, err := Encode(sample())
	if err != nil {
		t.Fatal(err)
	}
	nl := bytes.IndexByte(data, '\n')
	body := mutate(string(data[nl+1:]))
	return withHeader(body)
}

func withHeader(body string) []byte {
	sum := sha256Hex([]byte(body))
	return []byte(fmt.Sprintf("%s %d %d %s\n%s", magic, Version, len(body), sum, body))
}

// b64 is s as the record writes it.
func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// replace is a body mutation replacing old by new once.
func replace(old, new string) func(string) string {
	return func(s string) string { return strings.Replace(s, old, new, 1) }
}

// TestHostileStateFileContents: damage to the record's structure refuses
// it whole with the reason.
func TestHostileStateFileContents(t *testing.T) {
	good, _ := Encode(sample())
	nl := bytes.IndexByte(good, '\n')
	cases := map[string]struct {
		data []byte
		want string
	}{
		"empty":         {nil, "no header"},
		"foreign":       {[]byte("hello world\nthis is not ours\n"), "not a kvdock state header"},
		"binary":        {bytes.Repeat([]byte{0xff}, 4096), "no header"},
		"version":       {bytes.Replace(good, []byte(magic+" 2 "), []byte(magic+" 9 "), 1), "format version"},
		"old version":   {bytes.Replace(good, []byte(magic+" 2 "), []byte(magic+" 1 "), 1), `format version "1", this build reads 2`},
		"truncated":     {good[:len(good)-10], "truncated"},
		"appended":      {append(append([]byte{}, good...), "{}"...), "truncated or appended"},
		"corrupt":       {append(append([]byte{}, good[:nl+20]...), append([]byte("X"), good[nl+21:]...)...), "checksum"},
		"overlap":       {hostileBody(t, replace(`"o":8192`, `"o":4096`)), "overlap"},
		"pool geometry": {hostileBody(t, replace(`"align":4096`, `"align":3000`)), "power-of-two"},
		"segment size":  {hostileBody(t, replace(`"size":1048576,"uid"`, `"size":1,"uid"`)), "segment of 1 bytes"},
		"unknown field": {hostileBody(t, replace(`{"build"`, `{"evil":1,"build"`)), "unknown field"},
		"raw string":    {hostileBody(t, replace(`"m":"`+b64("m")+`"`, `"m":"m!"`)), "base64"},
		"not a string":  {hostileBody(t, replace(`"m":"`+b64("m")+`"`, `"m":5`)), "want base64"},
		"long build":    {hostileBody(t, replace(`"build":"`+b64("test")+`"`, `"build":"`+b64(strings.Repeat("b", 2000))+`"`)), "build is 2000 bytes"},
		"trailing":      {withHeader(string(good[nl+1:]) + "{}"), "after the record"},
	}
	for name, tc := range cases {
		_, err := Decode(tc.data)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want ErrInvalid saying %q", name, err, tc.want)
		}
	}
}

// TestHostileStateFilePartsDroppedAlone: a part of the record that is bad
// on its own (an object, a registration, a lookup) is left out with a
// counted reason; the rest of the record is adopted as it was.
func TestHostileStateFilePartsDroppedAlone(t *testing.T) {
	deadline := regexp.MustCompile(`"d":[0-9]+`)
	reg := func(s string) (int, int) {
		i := strings.Index(s, `"registrations":[`) + len(`"registrations":[`)
		return i, i + strings.Index(s[i:], `],"lookups"`)
	}
	cases := map[string]struct {
		mutate               func(string) string
		want                 string // the reason
		drops, objects, held int
		regs, lookups        int
	}{
		"unaligned":      {replace(`"o":8192`, `"o":8193`), "object not aligned", 1, 7, 1, 1, 1},
		"outside":        {replace(`"o":8192`, `"o":1044480`), "object outside the pool", 1, 7, 1, 1, 1},
		"negative":       {replace(`"o":8192`, `"o":-8192`), "object not aligned", 1, 7, 1, 1, 1},
		"huge length":    {replace(`"l":5000`, `"l":9223372036854775000`), "object of no length", 1, 7, 1, 1, 1},
		"name index":     {replace(`"n":1`, `"n":99`), "name unknown", 1, 7, 1, 1, 1},
		"chunk":          {replace(`"c":"00`, `"c":"zz`), "chunk hash", 1, 7, 1, 1, 1},
		"short chunk":    {replace(`"c":"00`, `"c":"`), "chunk hash", 1, 7, 1, 1, 1},
		"write readable": {replace(`"h":true,`, ``), "recorded as readable (kept unreadable", 1, 8, 1, 1, 1},
		"bad held key":   {replace(`"c":"07`, `"c":"zz`), "chunk hash not 64 hex digits (kept unreadable", 1, 8, 1, 1, 1},
		"no deadline":    {func(s string) string { return deadline.ReplaceAllString(s, `"d":0`) }, "locked without a deadline", 1, 7, 0, 1, 1},
		"long salt":      {replace(`"s":"`+b64("0")+`"`, `"s":"`+b64(strings.Repeat("a", 2000))+`"`), "name unknown, or a string past the bound", 2, 6, 1, 1, 1},
		"mode":           {replace(`"mode":"`+b64("SHM")+`"`, `"mode":"`+b64("ROOT")+`"`), "want SHM or PICKLE", 1, 8, 1, 0, 1},
		"payload id":     {replace(`"instance":7`, `"instance":8`), "payload names instance 8", 1, 8, 1, 0, 1},
		"long model":     {replace(`"model":"`+b64("m")+`"`, `"model":"`+b64(strings.Repeat("m", 2000))+`"`), "string past 1024 bytes", 1, 8, 1, 0, 1},
		"duplicate reg": {func(s string) string {
			i, j := reg(s)
			return s[:i] + s[i:j] + "," + s[i:j] + s[j:]
		}, "instance recorded twice", 2, 8, 1, 0, 1},
		"lookup hits": {replace(`"hits":3`, `"hits":-3`), "lookup invalid", 1, 8, 1, 1, 0},
		"lookup time": {replace(`"created_ns":99000000007`, `"created_ns":0`), "lookup invalid", 1, 8, 1, 1, 0},
		"lookup id":   {replace(`"id":"`+b64("req-1")+`"`, `"id":"`+b64(strings.Repeat("r", 2000))+`"`), "lookup invalid", 1, 8, 1, 1, 0},
	}
	for name, tc := range cases {
		r, err := Decode(hostileBody(t, tc.mutate))
		if err != nil {
			t.Errorf("%s: the whole record refused: %v", name, err)
			continue
		}
		held := 0
		for _, o := range r.Pool.Objects {
			if o.Held {
				held++
			}
		}
		reasons := strings.Join(r.Dropped.Reasons(), "; ")
		if r.Dropped.N != tc.drops || !strings.Contains(reasons, tc.want) || len(r.Pool.Objects) != tc.objects || held != tc.held ||
			len(r.Registrations) != tc.regs || len(r.Lookups) != tc.lookups {
			t.Errorf("%s: %d dropped (%s), %d objects (%d held), %d registrations, %d lookups; want %d dropped saying %q, %d objects (%d held), %d, %d",
				name, r.Dropped.N, reasons, len(r.Pool.Objects), held, len(r.Registrations), len(r.Lookups),
				tc.drops, tc.want, tc.objects, tc.held, tc.regs, tc.lookups)
		}
	}
}

// TestHostileManyNamesKeepTheRecord: one peer storing 65,600 one-chunk
// prompts under distinct salts made the next start refuse the record
// ("65601 names, at most 65536"), every tenant's cache lost. Names are
// bounded by the objects and registrations they serve: such a record is
// adopted whole; past its bounds a table loses only what does not fit.
func TestHostileManyNamesKeepTheRecord(t *testing.T) {
	const n = 65600
	r := sample()
	r.Pool.Size, r.Pool.Segment.Size = int64(n+16)*4096, int64(n+16)*4096
	for i := range n {
		k := keys.ObjectKey{Model: "m", KVRank: keys.KVRank(1, 0), Salt: fmt.Sprint("tenant-", i)}
		k.Chunk[0], k.Chunk[1], k.Chunk[2] = byte(i), byte(i>>8), byte(i>>16)
		r.Pool.Objects = append(r.Pool.Objects, l1.KeptObject{Key: k, Offset: int64(16+i) * 4096, Length: 4096})
	}
	data, err := Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(data)
	if err != nil {
		t.Fatalf("a record of %d salts refused: %v", n+2, err)
	}
	if len(got.Pool.Objects) != n+8 || got.Dropped.N != 0 {
		t.Fatalf("%d of %d objects kept, %v dropped", len(got.Pool.Objects), n+8, got.Dropped.Reasons())
	}
	// Past the lookups' bound, the oldest are left out, not the record.
	r = sample()
	r.Lookups = nil
	for i := range MaxLookups + 10 {
		r.Lookups = append(r.Lookups, Lookup{RequestID: fmt.Sprint("q", i), HitChunks: 1, Created: time.Unix(1000+int64(i), 0)})
	}
	if data, err = Encode(r); err != nil {
		t.Fatal(err)
	}
	if got, err = Decode(data); err != nil {
		t.Fatalf("a record of %d lookups refused: %v", MaxLookups+10, err)
	}
	if len(got.Lookups) != MaxLookups || got.Lookups[0].RequestID != "q10" || got.Dropped.N != 10 || len(got.Pool.Objects) != 8 {
		t.Fatalf("%d lookups kept from %q, %d dropped, %d objects", len(got.Lookups), got.Lookups[0].RequestID, got.Dropped.N, len(got.Pool.Objects))
	}
	// Past the registrations' bound, the ones after it.
	r = sample()
	base := r.Registrations[0]
	for i := range MaxRegistrations {
		g := base
		g.ID, g.Payload.InstanceID = int64(100+i), int64(100+i)
		r.Registrations = append(r.Registrations, g)
	}
	if data, err = Encode(r); err != nil {
		t.Fatal(err)
	}
	if got, err = Decode(data); err != nil {
		t.Fatalf("a record of %d registrations refused: %v", MaxRegistrations+1, err)
	}
	if len(got.Registrations) != MaxRegistrations || got.Dropped.N != 1 || got.Registrations[0].ID != 7 {
		t.Fatalf("%d registrations kept, %d dropped", len(got.Registrations), got.Dropped.N)
	}
}

// TestHostileRecordKeepsEveryByte: the strings a peer gave come back byte
// for byte, invalid UTF-8 included: salts that JSON text would make one
// ("\xff\xfe", "\xfe\xff" and "\ufffd\ufffd" all read as U+FFFD U+FFFD),
// a model name and a request id with invalid bytes.
func TestHostileRecordKeepsEveryByte(t *testing.T) {
	r := sample()
	salts := []string{"\xff\xfe", "\xfe\xff", "\ufffd\ufffd"}
	for i, o := range r.Pool.Objects[:6] {
		o.Key.Salt, o.Key.Model = salts[i%3], "m\xff"+fmt.Sprint(i/3)
		r.Pool.Objects[i] = o
	}
	r.Registrations[0].Payload.ModelName = "m\xff0"
	r.Registrations[0].Payload.DtypeStr = "f\xc3"
	r.Registrations[0].Profile = "p\x80"
	r.Lookups[0].RequestID = "req-\xff\x00\xfe"
	r.Endpoint = "h\xfe:1"
	data, err := Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip changed bytes:\n got %#v\nwant %#v", got, r)
	}
}

func TestHostileStateFileOnDisk(t *testing.T) {
	uid := os.Geteuid()
	write := func(t *testing.T) string {
		dir := filepath.Join(t.TempDir(), "state")
		if err := Write(dir, "x.state", sample()); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	t.Run("file mode", func(t *testing.T) {
		dir := write(t)
		os.Chmod(filepath.Join(dir, "x.state"), 0o644)
		if _, err := Take(dir, "x.state"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "want 0600") {
			t.Fatalf("err = %v", err)
		}
		if _, err := os.Lstat(filepath.Join(dir, "x.state")); !os.IsNotExist(err) {
			t.Fatal("refused file not consumed")
		}
	})
	t.Run("symlinked file", func(t *testing.T) {
		dir := write(t)
		os.Rename(filepath.Join(dir, "x.state"), filepath.Join(dir, "real"))
		os.Symlink(filepath.Join(dir, "real"), filepath.Join(dir, "x.state"))
		if _, err := Take(dir, "x.state"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "symbolic link") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("symlinked dir", func(t *testing.T) {
		dir := write(t)
		link := filepath.Join(t.TempDir(), "link")
		os.Symlink(dir, link)
		if _, err := Take(link, "x.state"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "symbolic link") {
			t.Fatalf("err = %v", err)
		}
		if err := Write(link, "y.state", sample()); !errors.Is(err, ErrInvalid) {
			t.Fatalf("write through a symlinked dir: %v", err)
		}
	})
	t.Run("dir writable by others", func(t *testing.T) {
		dir := write(t)
		os.Chmod(dir, 0o777)
		if _, err := Take(dir, "x.state"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "others may write") {
			t.Fatalf("err = %v", err)
		}
		if err := Write(dir, "x.state", sample()); !errors.Is(err, ErrInvalid) {
			t.Fatalf("write into a dir others write: %v", err)
		}
	})
	t.Run("directory in the way", func(t *testing.T) {
		dir := write(t)
		os.Remove(filepath.Join(dir, "x.state"))
		os.Mkdir(filepath.Join(dir, "x.state"), 0o700)
		if _, err := Take(dir, "x.state"); !errors.Is(err, ErrInvalid) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("corrupt on disk", func(t *testing.T) {
		dir := write(t)
		p := filepath.Join(dir, "x.state")
		data, _ := os.ReadFile(p)
		data[len(data)-3] ^= 1
		os.WriteFile(p, data, 0o600)
		if _, err := Take(dir, "x.state"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "checksum") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("wrong owner", func(t *testing.T) {
		if uid != 0 {
			// Only root can make a file of another user; as a user, the
			// same check refuses root's files in our directory.
			dir := write(t)
			p := filepath.Join(dir, "x.state")
			// A directory of another user is refused before any file is read.
			if _, err := Take("/", "x.state"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "owned by uid") {
				t.Fatalf("root's directory: %v", err)
			}
			_ = p
			return
		}
		dir := write(t)
		p := filepath.Join(dir, "x.state")
		os.Chown(p, 12345, 12345)
		if _, err := Take(dir, "x.state"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "owned by uid 12345") {
			t.Fatalf("err = %v", err)
		}
		dir = write(t)
		os.Chown(dir, 12345, 12345)
		if _, err := Take(dir, "x.state"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "owned by uid 12345") {
			t.Fatalf("dir: err = %v", err)
		}
	})
}

func TestFileNameIsOneSafeComponent(t *testing.T) {
	for _, h := range []string{"localhost", "../../etc", "::1", strings.Repeat("a", 500)} {
		n := FileName(h, 5555)
		if strings.ContainsAny(n, "/\x00") || len(n) > 200 || n != filepath.Base(n) {
			t.Errorf("FileName(%q) = %q", h, n)
		}
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestHostileTakeFileBound: a file beside the record (TakeFile) longer than
// its bound is refused and consumed; one within it comes back as written.
func TestHostileTakeFileBound(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := WriteFile(dir, "x.kvevents", make([]byte, 101)); err != nil {
		t.Fatal(err)
	}
	if _, err := TakeFile(dir, "x.kvevents", 100); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a file past its bound: %v", err)
	}
	if _, err := TakeFile(dir, "x.kvevents", 100); !errors.Is(err, ErrNone) {
		t.Fatalf("the refused file was not consumed: %v", err)
	}
	if err := WriteFile(dir, "x.kvevents", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	if b, err := TakeFile(dir, "x.kvevents", 100); err != nil || string(b) != "kept" {
		t.Fatalf("took %q, %v", b, err)
	}
}

// TestPendingFileInPlaceOnlyOnCommit: a state file written in pieces
// (Create, Write) is not under its name until Commit, which puts it there
// whole with mode 0600; Abort leaves neither the file nor its temporary
// one, and an earlier file of that name stays as it was until a Commit
// replaces it.
func TestPendingFileInPlaceOnlyOnCommit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := WriteFile(dir, "x.kv", []byte("before")); err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		es, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var ns []string
		for _, e := range es {
			ns = append(ns, e.Name())
		}
		return ns
	}
	read := func() string {
		b, err := os.ReadFile(filepath.Join(dir, "x.kv"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	f, err := Create(dir, "x.kv")
	if err != nil {
		t.Fatal(err)
	}
	for _, piece := range []string{"one ", "two ", "three"} {
		if _, err := f.Write([]byte(piece)); err != nil {
			t.Fatal(err)
		}
	}
	if got := read(); got != "before" {
		t.Fatalf("a pending file showed under its name: %q", got)
	}
	f.Abort()
	if got, ns := read(), names(); got != "before" || len(ns) != 1 {
		t.Fatalf("after Abort: %q, files %q", got, ns)
	}
	if f, err = Create(dir, "x.kv"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("after")); err != nil {
		t.Fatal(err)
	}
	if err := f.Commit(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, "x.kv"))
	if got, ns := read(), names(); err != nil || got != "after" || len(ns) != 1 || st.Mode().Perm() != 0o600 {
		t.Fatalf("after Commit: %q, files %q, mode %v (%v)", got, ns, st.Mode(), err)
	}
}
