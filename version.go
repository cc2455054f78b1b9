package main

import (
	"fmt"
	"io"
	"runtime/debug"
	"strings"
)

// versionText is what `kvdock version` (and --version, -v) prints: the
// version, then the commit the binary was built from, that commit's date
// and whether the tree held uncommitted changes, as the Go toolchain
// stamped them (nothing is stamped with -buildvcs=false or outside a
// repository, and the text says so rather than print blanks).
func versionText(v string, bi *debug.BuildInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kvdock %s\n", v)
	vcs := map[string]string{}
	if bi != nil {
		for _, s := range bi.Settings {
			vcs[s.Key] = s.Value
		}
	}
	if rev := vcs["vcs.revision"]; rev != "" {
		fmt.Fprintf(&b, "revision  %s\n", rev)
		if t := vcs["vcs.time"]; t != "" {
			fmt.Fprintf(&b, "date      %s\n", t)
		}
		switch vcs["vcs.modified"] {
		case "true":
			b.WriteString("modified  yes: built from a tree with uncommitted changes\n")
		case "false":
			b.WriteString("modified  no\n")
		}
	} else {
		b.WriteString("revision  unknown (built without VCS stamping: -buildvcs=false or outside a git checkout)\n")
	}
	if bi != nil && bi.GoVersion != "" {
		fmt.Fprintf(&b, "go        %s\n", bi.GoVersion)
	}
	return b.String()
}

// printVersion answers `kvdock version`, `kvdock --version` and `kvdock -v`.
func printVersion(stdout io.Writer) int {
	bi, _ := debug.ReadBuildInfo()
	fmt.Fprint(stdout, versionText(buildVersion(), bi))
	return 0
}
