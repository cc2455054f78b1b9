// Package termtext makes strings safe to print on a terminal. Peers choose
// model names, request ids and the text of the errors their input causes; a
// name holding "\x1b[31m" would recolour the dashboard, and other sequences
// can move the cursor, set the window title or write to the clipboard.
// Clean keeps printable text and drops the rest; CleanAll applies it to
// every string inside a value the faces are about to show.
package termtext

import (
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Clean returns s without control characters: C0 and C1 controls, DEL, whole
// escape sequences (CSI, OSC, DCS and the other string sequences, two- and
// three-byte escapes), and Unicode format characters (bidi overrides,
// zero-width marks). Tabs and line breaks become spaces (every place that
// shows a peer string is one line); invalid UTF-8 becomes U+FFFD. Printable
// text, non-ASCII included, is kept. Linear in len(s).
func Clean(s string) string {
	if plain(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteRune(utf8.RuneError)
			i++
		case r == 0x1b:
			i = skipEscape(s, i+1)
		case r == 0x9b: // C1 CSI
			i = skipCSI(s, i+size)
		case r == 0x90 || r == 0x9d || r == 0x98 || r == 0x9e || r == 0x9f: // C1 DCS, OSC, SOS, PM, APC
			i = skipString(s, i+size)
		case r == '\t' || r == '\n' || r == '\r' || r == '\u2028' || r == '\u2029':
			b.WriteByte(' ')
			i += size
		case r < 0x20 || (r >= 0x7f && r <= 0x9f) || unicode.Is(unicode.Cf, r):
			i += size
		default:
			b.WriteString(s[i : i+size])
			i += size
		}
	}
	return b.String()
}

// plain reports whether s is printable ASCII only (nothing to do).
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// skipEscape returns the index after the escape sequence whose ESC ended at
// i-1.
func skipEscape(s string, i int) int {
	if i >= len(s) {
		return i
	}
	switch c := s[i]; {
	case c == '[':
		return skipCSI(s, i+1)
	case c == ']' || c == 'P' || c == 'X' || c == '^' || c == '_':
		return skipString(s, i+1)
	case c >= 0x20 && c <= 0x2f: // intermediates, then one final byte
		for i < len(s) && s[i] >= 0x20 && s[i] <= 0x2f {
			i++
		}
		if i < len(s) && s[i] >= 0x30 && s[i] <= 0x7e {
			i++
		}
		return i
	case c >= 0x30 && c <= 0x7e:
		return i + 1
	}
	return i // a lone ESC: the next character is judged on its own
}

// skipCSI skips parameter and intermediate bytes and the final byte.
func skipCSI(s string, i int) int {
	for i < len(s) && s[i] >= 0x20 && s[i] <= 0x3f {
		i++
	}
	if i < len(s) && s[i] >= 0x40 && s[i] <= 0x7e {
		i++
	}
	return i
}

// skipString skips an OSC/DCS/SOS/PM/APC body through its terminator: BEL,
// ESC \ or C1 ST. An unterminated one runs to the end of s.
func skipString(s string, i int) int {
	for i < len(s) {
		switch {
		case s[i] == 0x07:
			return i + 1
		case s[i] == 0x1b && i+1 < len(s) && s[i+1] == '\\':
			return i + 2
		case strings.HasPrefix(s[i:], "\u009c"):
			return i + len("\u009c")
		}
		i++
	}
	return i
}

// CleanAll applies Clean to every string reachable from ptr (a pointer):
// exported struct fields, slice and array elements, map keys and values,
// through pointers. Slices, maps and pointers inside are replaced by cleaned
// copies, never written through, so memory the value shares with others
// (a snapshot's slices, a config's *string) is left alone.
func CleanAll(ptr any) {
	v := reflect.ValueOf(ptr)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return
	}
	clean(v.Elem())
}

func clean(v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		if v.CanSet() {
			if c := Clean(v.String()); c != v.String() {
				v.SetString(c)
			}
		}
	case reflect.Pointer:
		if v.IsNil() || !v.CanSet() {
			return
		}
		n := reflect.New(v.Type().Elem())
		n.Elem().Set(v.Elem())
		clean(n.Elem())
		v.Set(n)
	case reflect.Struct:
		t := v.Type()
		for i := range v.NumField() {
			if t.Field(i).IsExported() {
				clean(v.Field(i))
			}
		}
	case reflect.Array:
		for i := range v.Len() {
			clean(v.Index(i))
		}
	case reflect.Slice:
		if v.IsNil() || !v.CanSet() || v.Type().Elem().Kind() == reflect.Uint8 {
			return // bytes are not text
		}
		n := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		reflect.Copy(n, v)
		for i := range n.Len() {
			clean(n.Index(i))
		}
		v.Set(n)
	case reflect.Map:
		if v.IsNil() || !v.CanSet() {
			return
		}
		out := reflect.MakeMapWithSize(v.Type(), v.Len())
		iter := v.MapRange()
		for iter.Next() {
			k := reflect.New(v.Type().Key()).Elem()
			k.Set(iter.Key())
			clean(k)
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(iter.Value())
			clean(e)
			out.SetMapIndex(k, e)
		}
		v.Set(out)
	}
}
