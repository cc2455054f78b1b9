package settings

import (
	"errors"
	"fmt"
)

// MemoryProbe reports the memory the host can give a new pool: Linux's
// MemAvailable (core/hostmem.Probe reads it). Tests pass a fixed figure.
type MemoryProbe interface {
	MemAvailable() (int64, error)
}

// MemoryNeed is the host memory c commits up front: the L1 pool. (The
// tiers' buffers join it here when tiers exist; none do yet.)
func MemoryNeed(c Config) int64 {
	return c.L1.SizeBytes()
}

// CheckMemory refuses a configuration whose memory need exceeds avail
// bytes, unless l1.allow_overcommit is set: a pool larger than the host
// starts, then prefaults (or fills) until the kernel's OOM killer ends it.
// It is pure: the caller reads the host (MemoryProbe) and adds what a
// rebuild would free first. A non-positive avail (unknown) checks nothing.
// The problem names both sizes.
func CheckMemory(c Config, src map[string]Source, avail int64) error {
	need := MemoryNeed(c)
	if c.L1.AllowOvercommit || avail <= 0 || need <= avail {
		return nil
	}
	return &ValidationError{Problems: []Problem{{
		Key: "l1.size_gb", Value: display(&c.L1.SizeGB), Source: src["l1.size_gb"],
		Reason: fmt.Sprintf("the pool needs %s but the host has %s available (MemAvailable); lower it or pass --l1-allow-overcommit",
			BytesText(need), BytesText(avail)),
	}}}
}

// LoadForServe is Load followed by CheckMemory against avail bytes (the
// host's MemAvailable; 0 checks nothing): every setting serve refuses, in
// one *ValidationError. serve and kvdock config check both call it, so
// check passes exactly what serve starts with. Like Load, it returns the
// Loaded with a *ValidationError and nil with any other error.
func LoadForServe(opts LoadOptions, avail int64) (*Loaded, error) {
	l, err := Load(opts)
	var ve *ValidationError
	if err != nil && !errors.As(err, &ve) {
		return nil, err
	}
	var probs []Problem
	sizeBad := false
	if ve != nil {
		probs = ve.Problems
		for _, p := range probs {
			// A size or switch that did not decode is not checked again.
			sizeBad = sizeBad || p.Key == "l1.size_gb" || p.Key == "l1.allow_overcommit"
		}
	}
	var me *ValidationError
	if !sizeBad && errors.As(CheckMemory(l.Config, l.Sources, avail), &me) {
		probs = append(probs, me.Problems...)
	}
	if len(probs) == 0 {
		return l, nil
	}
	return l, &ValidationError{Problems: probs}
}

// MemoryWarnShare is the share of the host's available memory above which
// a pool is accepted with a warning: the host is left too little for the
// workers, the page cache and kvdock's own heap.
const MemoryWarnShare = 0.8

// MemoryWarning is the warning for a configuration whose memory need is
// above MemoryWarnShare of avail bytes ("" when it is not, or avail is
// unknown). A need above avail itself is CheckMemory's refusal, unless
// l1.allow_overcommit lets it through, which the warning says.
func MemoryWarning(c Config, avail int64) string {
	need := MemoryNeed(c)
	if avail <= 0 || float64(need) <= MemoryWarnShare*float64(avail) {
		return ""
	}
	share := fmt.Sprintf("the pool (l1.size_gb) takes %s of the %s the host has available (MemAvailable, %.0f %%)",
		BytesText(need), BytesText(avail), 100*float64(need)/float64(avail))
	if need > avail {
		if c.L1.AllowOvercommit {
			return share + ": l1.allow_overcommit lets it start, and the OOM killer may end kvdock or a worker once it fills"
		}
		return share + ": kvdock serve refuses it; lower it or pass --l1-allow-overcommit"
	}
	return fmt.Sprintf("%s: above %.0f %%, the workers and the page cache are left little; consider a smaller pool", share, 100*MemoryWarnShare)
}
