package restart

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
		k := keys.ObjectKey{Model: "m", KVRank: keys.KVRank(1, 0), Salt: fmt.Sprint(i % 2)}
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

func TestHostileStateFileContents(t *testing.T) {
	good, _ := Encode(sample())
	nl := bytes.IndexByte(good, '\n')
	cases := map[string]struct {
		data []byte
		want string
	}{
		"empty":          {nil, "no header"},
		"foreign":        {[]byte("hello world\nthis is not ours\n"), "not a kvdock state header"},
		"binary":         {bytes.Repeat([]byte{0xff}, 4096), "no header"},
		"version":        {bytes.Replace(good, []byte(magic+" 1 "), []byte(magic+" 9 "), 1), "format version"},
		"truncated":      {good[:len(good)-10], "truncated"},
		"appended":       {append(append([]byte{}, good...), "{}"...), "truncated or appended"},
		"corrupt":        {append(append([]byte{}, good[:nl+20]...), append([]byte("X"), good[nl+21:]...)...), "checksum"},
		"overlap":        {hostileBody(t, func(s string) string { return strings.Replace(s, `"o":8192`, `"o":4096`, 1) }), "overlap"},
		"unaligned":      {hostileBody(t, func(s string) string { return strings.Replace(s, `"o":8192`, `"o":8193`, 1) }), "not aligned"},
		"outside":        {hostileBody(t, func(s string) string { return strings.Replace(s, `"o":8192`, `"o":1044480`, 1) }), "passes the pool"},
		"negative":       {hostileBody(t, func(s string) string { return strings.Replace(s, `"o":8192`, `"o":-8192`, 1) }), "not aligned"},
		"huge length":    {hostileBody(t, func(s string) string { return strings.Replace(s, `"l":5000`, `"l":9223372036854775000`, 1) }), "want > 0"},
		"name index":     {hostileBody(t, func(s string) string { return strings.Replace(s, `"n":1`, `"n":99`, 1) }), "name index"},
		"chunk":          {hostileBody(t, func(s string) string { return strings.Replace(s, `"c":"00`, `"c":"zz`, 1) }), "chunk hash"},
		"short chunk":    {hostileBody(t, func(s string) string { return strings.Replace(s, `"c":"00`, `"c":"`, 1) }), "hex digits"},
		"write readable": {hostileBody(t, func(s string) string { return strings.Replace(s, `"h":true,`, ``, 1) }), "recorded as readable"},
		"no deadline":    {hostileBody(t, func(s string) string { return strings.Replace(s, `"w":true,`, `"w":true,"rd":3,`, 1) + "" }), ""},
		"pool geometry":  {hostileBody(t, func(s string) string { return strings.Replace(s, `"align":4096`, `"align":3000`, 1) }), "power-of-two"},
		"segment size":   {hostileBody(t, func(s string) string { return strings.Replace(s, `"size":1048576,"uid"`, `"size":1,"uid"`, 1) }), "segment of 1 bytes"},
		"unknown field":  {hostileBody(t, func(s string) string { return strings.Replace(s, `{"build"`, `{"evil":1,"build"`, 1) }), "unknown field"},
		"mode":           {hostileBody(t, func(s string) string { return strings.Replace(s, `"mode":"SHM"`, `"mode":"ROOT"`, 1) }), "want SHM or PICKLE"},
		"duplicate reg": {hostileBody(t, func(s string) string {
			i := strings.Index(s, `"registrations":[`) + len(`"registrations":[`)
			j := i + strings.Index(s[i:], `],"lookups"`)
			reg := s[i:j]
			return s[:i] + reg + "," + reg + s[j:]
		}), "recorded twice"},
		"payload id":  {hostileBody(t, func(s string) string { return strings.Replace(s, `"InstanceID":7`, `"InstanceID":8`, 1) }), "payload names"},
		"long string": {hostileBody(t, func(s string) string { return strings.Replace(s, `"m":"m"`, `"m":"`+strings.Repeat("a", 2000)+`"`, 1) }), "at most 1024"},
		"oversized count": {hostileBody(t, func(s string) string {
			s = strings.Replace(s, `"size":1048576,"uid"`, `"size":16384,"uid"`, 1)
			return strings.Replace(s, `"size":1048576,"align"`, `"size":16384,"align"`, 1)
		}), "objects, at most"},
		"trailing":    {withHeader(string(good[nl+1:]) + "{}"), "after the record"},
		"lookup hits": {hostileBody(t, func(s string) string { return strings.Replace(s, `"hits":3`, `"hits":-3`, 1) }), "lookup 0"},
		"lookup time": {hostileBody(t, func(s string) string { return strings.Replace(s, `"created_ns":99000000007`, `"created_ns":0`, 1) }), "lookup 0"},
		"lookup id": {hostileBody(t, func(s string) string {
			return strings.Replace(s, `"id":"req-1"`, `"id":"`+strings.Repeat("r", 2000)+`"`, 1)
		}), "lookup 0 request id"},
	}
	for name, tc := range cases {
		_, err := Decode(tc.data)
		if tc.want == "" {
			// Locks with a deadline are fine; the mutation must still decode.
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want ErrInvalid saying %q", name, err, tc.want)
		}
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
