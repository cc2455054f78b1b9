package settings

import (
	"fmt"
	"strings"
)

// Problem is one thing wrong with the settings.
type Problem struct {
	Key    string // dotted key ("l1.size_gb"), or a file/flag name when no key applies
	Value  string // the offending value as shown to a person ("-2", `"md5"`); "" when not about a value
	Source Source
	Reason string // what is accepted
}

// String reads "l1.size_gb = -2 (from KVDOCK_L1_SIZE_GB): must be > 0".
func (p Problem) String() string {
	if p.Value == "" {
		return fmt.Sprintf("%s (from %s): %s", p.Key, p.Source, p.Reason)
	}
	return fmt.Sprintf("%s = %s (from %s): %s", p.Key, p.Value, p.Source, p.Reason)
}

// ValidationError lists every problem found, not just the first.
type ValidationError struct {
	Problems []Problem
}

// Error prints one problem per line under a count.
func (e *ValidationError) Error() string {
	var b strings.Builder
	if len(e.Problems) == 1 {
		b.WriteString("invalid settings (1 problem):")
	} else {
		fmt.Fprintf(&b, "invalid settings (%d problems):", len(e.Problems))
	}
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(p.String())
	}
	return b.String()
}

// Validate checks every rule and returns a *ValidationError listing every
// broken one, each with the value's source from src (a missing entry reads
// as "default"), or nil.
func Validate(c Config, src map[string]Source) error {
	probs := validate(c, src, nil)
	if len(probs) == 0 {
		return nil
	}
	return &ValidationError{Problems: probs}
}

// validate skips the keys in skip (they already failed to decode).
func validate(c Config, src map[string]Source, skip map[string]bool) []Problem {
	var probs []Problem
	for _, d := range table() {
		if skip[d.key] {
			continue
		}
		if reason := d.verdict(c); reason != "" {
			shown := display(d.field(&c))
			if d.secret {
				shown = redactShown(d, &c)
			}
			probs = append(probs, Problem{Key: d.key, Value: shown, Source: src[d.key], Reason: reason})
		}
	}
	if !skip[KeyAdapters] {
		probs = append(probs, validateAdapters(c.L2.Adapters, src[KeyAdapters])...)
	}
	return probs
}
