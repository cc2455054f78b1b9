package main

import (
	"fmt"
	"io"
	"runtime/debug"
	"strings"
)

// Build stamps, set with -ldflags "-X main.version=… -X main.revision=…
// -X main.revisionDate=…" (task build does, from git), so a binary built
// where the toolchain stamps no VCS data (GOFLAGS=-buildvcs=false, common
// in CI images) still says what it is.
var (
	version      = ""
	revision     = ""
	revisionDate = ""
)

// unstamped is the version of a binary built with neither the stamps nor
// VCS data (short: the dashboard's header and /status show it); the
// version text says what it means.
const unstamped = "dev"

// buildVersion is the stamped version, else "dev-" and the commit the
// toolchain stamped, else the module version, else unstamped.
func buildVersion() string {
	bi, _ := debug.ReadBuildInfo()
	return versionOf(version, bi)
}

func versionOf(stamped string, bi *debug.BuildInfo) string {
	if stamped != "" {
		return stamped
	}
	if bi != nil {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "dev-" + s.Value[:12]
			}
		}
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			return bi.Main.Version
		}
	}
	return unstamped
}

// stamps are the build's own stamps (-ldflags -X), which win over the
// toolchain's VCS settings.
type stamps struct {
	version, revision, date string
}

// versionText is what `kvdock version` (and --version, -v) prints: the
// version, then the commit the binary was built from, that commit's date
// and whether the tree held uncommitted changes: from the build's stamps
// (task build), else as the Go toolchain stamped them. With neither, the
// text says so and how to get them, rather than print blanks.
func versionText(st stamps, bi *debug.BuildInfo) string {
	var b strings.Builder
	v := versionOf(st.version, bi)
	if v == unstamped {
		v += " (no version stamped: a plain go build; task build stamps one from git)"
	}
	fmt.Fprintf(&b, "kvdock %s\n", v)
	vcs := map[string]string{}
	if bi != nil {
		for _, s := range bi.Settings {
			vcs[s.Key] = s.Value
		}
	}
	switch {
	case st.revision != "":
		fmt.Fprintf(&b, "revision  %s\n", st.revision)
		if st.date != "" {
			fmt.Fprintf(&b, "date      %s\n", st.date)
		}
	case vcs["vcs.revision"] != "":
		fmt.Fprintf(&b, "revision  %s\n", vcs["vcs.revision"])
		if t := vcs["vcs.time"]; t != "" {
			fmt.Fprintf(&b, "date      %s\n", t)
		}
		switch vcs["vcs.modified"] {
		case "true":
			b.WriteString("modified  yes: built from a tree with uncommitted changes\n")
		case "false":
			b.WriteString("modified  no\n")
		}
	default:
		b.WriteString("revision  unknown: this binary carries no build stamps (task build sets them from git)\n" +
			"          and the Go toolchain stamped no VCS data (-buildvcs=false, or built outside a git checkout)\n")
	}
	if bi != nil && bi.GoVersion != "" {
		fmt.Fprintf(&b, "go        %s\n", bi.GoVersion)
	}
	return b.String()
}

// printVersion answers `kvdock version`, `kvdock --version` and `kvdock -v`.
func printVersion(stdout io.Writer) int {
	bi, _ := debug.ReadBuildInfo()
	fmt.Fprint(stdout, versionText(stamps{version, revision, revisionDate}, bi))
	return 0
}
