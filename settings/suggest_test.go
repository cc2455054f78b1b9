package settings

import (
	"errors"
	"slices"
	"testing"

	"github.com/spf13/pflag"
)

func TestClosestNamesTyposAndPrefixes(t *testing.T) {
	flags := []string{"port", "protocol", "http-port", "host", "timeout", "yes"}
	for _, tc := range []struct {
		word string
		want []string
	}{
		{"prot", []string{"port", "protocol"}},
		{"htp-port", []string{"http-port"}},
		{"timeot", []string{"timeout"}},
		{"zzzzzz", nil},
		{"port", nil}, // a known name is no typo
	} {
		if got := Closest(tc.word, flags); !slices.Equal(got, tc.want) {
			t.Errorf("Closest(%q) = %q, want %q", tc.word, got, tc.want)
		}
	}
}

func TestFlagHint(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.Int("port", 0, "")
	fs.String("protocol", "", "")
	err := fs.Parse([]string{"--prot", "1"})
	if got, want := FlagHint(fs, err), "; did you mean --port or --protocol?"; got != want {
		t.Fatalf("FlagHint(%v) = %q, want %q", err, got, want)
	}
	if got := FlagHint(fs, errors.New("invalid argument")); got != "" {
		t.Fatalf("another error got a hint: %q", got)
	}
}
