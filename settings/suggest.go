package settings

import (
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// Closest lists the candidates a mistyped word most likely meant, nearest
// first, at most three: those it starts (--prot for --protocol) and those
// one or two edits away (a swap of two neighbours is one: --prot for
// --port). None when nothing is that close, or word is a candidate.
func Closest(word string, candidates []string) []string {
	if slices.Contains(candidates, word) {
		return nil
	}
	type near struct {
		s string
		d int
	}
	var out []near
	limit := 2
	if len(word) <= 3 {
		limit = 1
	}
	for _, c := range candidates {
		d := editDistance(word, c)
		switch {
		case d <= limit:
			out = append(out, near{c, d})
		case word != "" && strings.HasPrefix(c, word):
			out = append(out, near{c, limit + 1})
		}
	}
	slices.SortStableFunc(out, func(a, b near) int { return a.d - b.d })
	var names []string
	for i := 0; i < len(out) && i < 3; i++ {
		names = append(names, out[i].s)
	}
	return names
}

// DidYouMean is "; did you mean --port or --protocol?" for the names
// Closest finds (each with prefix), "" when it finds none.
func DidYouMean(prefix, word string, candidates []string) string {
	names := Closest(word, candidates)
	if len(names) == 0 {
		return ""
	}
	for i, n := range names {
		names[i] = prefix + n
	}
	last := names[len(names)-1]
	if len(names) > 1 {
		return "; did you mean " + strings.Join(names[:len(names)-1], ", ") + " or " + last + "?"
	}
	return "; did you mean " + last + "?"
}

// FlagHint is DidYouMean for pflag's "unknown flag: --NAME" error among
// the flags of fs; "" for any other error.
func FlagHint(fs *pflag.FlagSet, err error) string {
	if err == nil {
		return ""
	}
	name, ok := strings.CutPrefix(err.Error(), "unknown flag: --")
	if !ok {
		return ""
	}
	var flags []string
	fs.VisitAll(func(f *pflag.Flag) { flags = append(flags, f.Name) })
	return DidYouMean("--", name, flags)
}

// editDistance is the optimal string alignment distance of a and b: the
// insertions, deletions, substitutions and swaps of neighbours that turn
// one into the other.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}
