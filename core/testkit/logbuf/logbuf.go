// Package logbuf is the log sink tests give a server (a subprocess's stdout,
// an in-process slog handler): safe for the writers' goroutines, readable at
// any time, and able to wait for a line without polling.
package logbuf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Buffer collects everything written to it. The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	// grew is closed (and replaced) by every Write, waking Wait.
	grew chan struct{}
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.b.Write(p)
	if s.grew != nil {
		close(s.grew)
		s.grew = nil
	}
	return n, err
}

// String is everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Wait returns nil once the text contains substr, or an error (with the
// text so far) when limit passes first.
func (s *Buffer) Wait(substr string, limit time.Duration) error {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		s.mu.Lock()
		if strings.Contains(s.b.String(), substr) {
			s.mu.Unlock()
			return nil
		}
		if s.grew == nil {
			s.grew = make(chan struct{})
		}
		grew := s.grew
		s.mu.Unlock()
		select {
		case <-grew:
		case <-timer.C:
			return fmt.Errorf("%q not written within %v; output so far:\n%s", substr, limit, s.String())
		}
	}
}

// RepeatedKeys lists the top-level keys that occur more than once in each
// JSON log record of s (one per line), as "key in line": slog's JSON
// handler writes a key given twice twice, which a map decode would hide.
func RepeatedKeys(s string) ([]string, error) {
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if line == "" {
			continue
		}
		d := json.NewDecoder(strings.NewReader(line))
		if _, err := d.Token(); err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		seen := map[string]bool{}
		for d.More() {
			k, err := d.Token()
			if err != nil {
				return nil, fmt.Errorf("%q: %w", line, err)
			}
			var v json.RawMessage
			if err := d.Decode(&v); err != nil {
				return nil, fmt.Errorf("%q: %w", line, err)
			}
			key, _ := k.(string)
			if seen[key] {
				out = append(out, key+" in "+line)
			}
			seen[key] = true
		}
	}
	return out, nil
}
