package settings_test

import (
	"errors"
	"strings"
	"testing"

	"kvdock/settings"
)

// A pool larger than the host's available memory is
// refused, naming both sizes, unless overcommit is allowed.
func TestCheckMemory(t *testing.T) {
	c := settings.Default()
	c.L1.SizeGB = 40
	src := map[string]settings.Source{"l1.size_gb": {Kind: settings.SourceFlag, Detail: "--l1-size-gb"}}
	avail := int64(23 << 30)

	err := settings.CheckMemory(c, src, avail)
	var ve *settings.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 1 {
		t.Fatalf("want one problem, got %v", err)
	}
	p := ve.Problems[0]
	if p.Key != "l1.size_gb" || p.Value != "40" || p.Source.Detail != "--l1-size-gb" {
		t.Fatalf("problem %+v", p)
	}
	for _, want := range []string{"40.0 GiB", "23.0 GiB available", "--l1-allow-overcommit"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("%q lacks %q", err, want)
		}
	}

	// Exactly the available memory fits; one byte more does not.
	c.L1.SizeGB = 23
	if err := settings.CheckMemory(c, src, avail); err != nil {
		t.Fatalf("a pool of exactly the available memory: %v", err)
	}
	if err := settings.CheckMemory(c, src, avail-1); err == nil {
		t.Fatal("a pool one byte over the available memory was accepted")
	}

	// Overcommit allowed, or the host unknown: no check.
	c.L1.SizeGB = 40
	c.L1.AllowOvercommit = true
	if err := settings.CheckMemory(c, src, avail); err != nil {
		t.Fatalf("overcommit allowed: %v", err)
	}
	c.L1.AllowOvercommit = false
	for _, unknown := range []int64{0, -1} {
		if err := settings.CheckMemory(c, src, unknown); err != nil {
			t.Fatalf("unknown host memory %d: %v", unknown, err)
		}
	}
}

// The overcommit key is an ordinary setting: flag, env, YAML, default off.
func TestAllowOvercommitKey(t *testing.T) {
	if settings.Default().L1.AllowOvercommit {
		t.Fatal("overcommit on by default")
	}
	l := mustLoad(t, settings.LoadOptions{Flags: flags(t, "--l1-allow-overcommit"), Environ: []string{}})
	if !l.Config.L1.AllowOvercommit || l.Sources["l1.allow_overcommit"].Kind != settings.SourceFlag {
		t.Fatalf("--l1-allow-overcommit: %+v %v", l.Config.L1, l.Sources["l1.allow_overcommit"])
	}
	l = mustLoad(t, settings.LoadOptions{Environ: []string{"KVDOCK_L1_ALLOW_OVERCOMMIT=true"}})
	if !l.Config.L1.AllowOvercommit {
		t.Fatal("KVDOCK_L1_ALLOW_OVERCOMMIT=true ignored")
	}
}

// The warning starts above 80 % of the available memory, and says what
// serve does past all of it.
func TestMemoryWarning(t *testing.T) {
	const gib = 1 << 30
	c := settings.Default()
	c.L1.SizeGB = 22
	for _, tc := range []struct {
		avail      int64
		overcommit bool
		want       string
	}{
		{0, false, ""},
		{100 * gib, false, ""},
		{275 * gib / 10, false, ""},
		{22760 * gib / 1000, false, "takes 22.0 GiB of the 22.8 GiB the host has available (MemAvailable, 97 %): above 80 %"},
		{20 * gib, false, "kvdock serve refuses it"},
		{20 * gib, true, "l1.allow_overcommit lets it start"},
	} {
		c.L1.AllowOvercommit = tc.overcommit
		got := settings.MemoryWarning(c, tc.avail)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("avail %d overcommit %v: %q, want %q", tc.avail, tc.overcommit, got, tc.want)
		}
	}
}
