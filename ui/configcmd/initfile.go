package configcmd

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"

	"kvdock/assets"
	"kvdock/settings"
)

const initHeader = `# kvdock settings file, written by kvdock config init.
#
# kvdock reads, weakest first: built-in defaults < this file < KVDOCK_*
# environment variables < command-line flags. Every key below is commented
# out at its default and followed by its flag and environment variable:
# remove the "# " before a key to set it. A key left commented follows
# kvdock's default, also when a later release changes it.
# kvdock config show --sources prints what kvdock would run with and where
# each value came from.
`

var (
	groupLine = regexp.MustCompile(`^([a-z0-9_]+):\s*$`)
	// A key at its default, set ("  port: 5555") or already commented out
	// because its default is an absence ("  # shm_name: ~", auto).
	keyLine = regexp.MustCompile(`^  (# )?([a-z0-9_]+): (.+)$`)
)

// initFile is what init writes: the annotated defaults of the embedded file
// with every value commented out, so the file sets nothing (a default a
// later release changes is not pinned by it), each key followed by its flag
// and environment variable as the key table names them.
func initFile() ([]byte, error) {
	src := assets.DefaultConfig()
	// The embedded file's own header is replaced: it describes a file that
	// sets every key.
	if i := bytes.Index(src, []byte("\n\n")); i >= 0 && bytes.HasPrefix(src, []byte("#")) {
		src = src[i+1:]
	}
	var b strings.Builder
	b.WriteString(initHeader)
	group, seen := "", map[string]bool{}
	for _, line := range strings.SplitAfter(string(src), "\n") {
		body := strings.TrimSuffix(line, "\n")
		if m := groupLine.FindStringSubmatch(body); m != nil {
			group = m[1]
		}
		m := keyLine.FindStringSubmatch(body)
		if m == nil {
			b.WriteString(line)
			continue
		}
		key := group + "." + m[2]
		ki, ok := settings.LookupKey(key)
		if !ok {
			if m[1] != "" {
				b.WriteString(line) // a comment that only looks like a key
				continue
			}
			return nil, fmt.Errorf("the embedded settings file sets %s, which is no setting", key)
		}
		seen[key] = true
		flag := "--" + ki.Flag
		if ki.NoFlag != "" {
			flag += " / --" + ki.NoFlag
		}
		fmt.Fprintf(&b, "  # %s: %s  # %s, %s\n", m[2], m[3], flag, ki.Env)
	}
	for _, k := range settings.KeyNames() {
		if !seen[k] {
			return nil, fmt.Errorf("the embedded settings file lacks %s", k)
		}
	}
	return []byte(b.String()), nil
}
