package termtext

import (
	"strings"
	"testing"
)

func TestClean(t *testing.T) {
	cases := []struct{ in, want string }{
		{"\x1b[31mEVIL\x1b[0m\x07", "EVIL"},
		{"meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"},
		{"Qwen/通义千问-7B ünï", "Qwen/通义千问-7B ünï"},
		{"a\x1b]0;owned title\x07b", "ab"},          // OSC, BEL-terminated
		{"a\x1b]52;c;ZXZpbA==\x1b\\b", "ab"},        // OSC 52 clipboard, ST-terminated
		{"a\x1bPq#0;2;0;0;0\x1b\\b", "ab"},          // DCS
		{"a\x1b(Bb", "ab"},                          // charset escape
		{"a\x1b7\x1b8b", "ab"},                      // save/restore cursor
		{"a\u009b2Jb", "ab"},                        // C1 CSI
		{"a\u009d0;t\u009cb", "ab"},                 // C1 OSC ... ST
		{"a\u0085b\x7fc\x00d", "abcd"},              // C1 NEL, DEL, NUL
		{"line1\nline2\tend\r", "line1 line2 end "}, // one line
		{"abc\u202edcba", "abcdcba"},                // bidi override
		{"bad\xffutf8", "bad\ufffdutf8"},            // invalid UTF-8
		{"\x1b[", ""},                               // truncated CSI
		{"\x1b]unterminated", ""},                   // unterminated OSC
		{"x\x1b", "x"},                              // lone ESC at the end
		{"\x1b\x1b[1mA", "A"},                       // ESC ESC
	}
	for _, tc := range cases {
		got := Clean(tc.in)
		if got != tc.want {
			t.Errorf("Clean(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if Clean(got) != got {
			t.Errorf("Clean is not idempotent on %q", got)
		}
		assertSafe(t, got)
	}
}

func assertSafe(t *testing.T, s string) {
	t.Helper()
	for _, r := range s {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			t.Fatalf("control character %U left in %q", r, s)
		}
	}
}

// TestCleanIsLinear: megabytes of escapes clean in one pass.
func TestCleanIsLinear(t *testing.T) {
	s := strings.Repeat("\x1b[", 1<<20) + strings.Repeat("\x1b]", 1<<20) + strings.Repeat("\xff", 1<<20)
	assertSafe(t, Clean(s))
}

func FuzzClean(f *testing.F) {
	f.Add("\x1b[31mEVIL\x1b[0m\x07")
	f.Add("a\u009d0;t\u009cb\xff")
	f.Fuzz(func(t *testing.T, s string) {
		got := Clean(s)
		assertSafe(t, got)
		if strings.ContainsRune(got, 0x1b) || len(got) > 3*len(s) {
			t.Fatalf("Clean(%q) = %q", s, got)
		}
	})
}

type inner struct {
	Name  string
	Alias *string
}

type outer struct {
	Model   string
	Items   []inner
	ByName  map[string]inner
	Arr     [2]string
	Bytes   []byte
	private string
}

func TestCleanAllCopiesWhatItChanges(t *testing.T) {
	alias := "\x1b[1mA"
	items := []inner{{Name: "\x1b[31mX", Alias: &alias}}
	v := outer{
		Model: "\x1b[31mEVIL\x1b[0m\x07", Items: items,
		ByName: map[string]inner{"k\x07": {Name: "v\x1b[0m"}},
		Arr:    [2]string{"\x07a", "b"}, Bytes: []byte("\x1b"), private: "\x1b",
	}
	shared := v.ByName
	CleanAll(&v)
	if v.Model != "EVIL" || v.Items[0].Name != "X" || *v.Items[0].Alias != "A" || v.Arr[0] != "a" {
		t.Fatalf("not cleaned: %+v", v)
	}
	if e, ok := v.ByName["k"]; !ok || e.Name != "v" {
		t.Fatalf("map not cleaned: %+v", v.ByName)
	}
	if items[0].Name != "\x1b[31mX" || alias != "\x1b[1mA" || shared["k\x07"].Name != "v\x1b[0m" {
		t.Fatal("CleanAll wrote into memory the value shares")
	}
	if string(v.Bytes) != "\x1b" || v.private != "\x1b" {
		t.Fatal("bytes and unexported fields are not text and must stay")
	}
}
