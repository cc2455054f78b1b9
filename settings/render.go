package settings

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
)

// Render writes c as a settings file kvdock can read back: keys grouped as
// in the file, in file order. With src not nil, every line ends with a
// comment naming the value's source ("# from KVDOCK_PORT", "# default").
// An absent server.shm_name (auto) is written as a comment line.
func Render(c Config, src map[string]Source) []byte {
	var b bytes.Buffer
	group := ""
	for _, d := range table() {
		if g := d.group(); g != group {
			if group != "" {
				b.WriteByte('\n')
			}
			group = g
			fmt.Fprintf(&b, "%s:\n", g)
		}
		ptr := d.field(&c)
		var line string
		if p, ok := ptr.(**string); ok && *p == nil {
			line = fmt.Sprintf("  # %s: not set (auto: the L1 settings decide)", d.leaf())
		} else {
			line = fmt.Sprintf("  %s: %s", d.leaf(), yamlValue(ptr))
		}
		if src != nil {
			s := src[d.key]
			if s.Kind == SourceDefault {
				line += "  # default"
			} else {
				line += "  # from " + s.String()
			}
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// yamlValue writes a field as a YAML scalar; strings stay plain when YAML
// would read them back unchanged, and are double-quoted otherwise.
func yamlValue(ptr any) string {
	var s string
	switch p := ptr.(type) {
	case *string:
		s = *p
	case **string:
		s = **p
	default:
		return text(ptr)
	}
	out, err := yamlv3.Marshal(s)
	if plain := strings.TrimSuffix(string(out), "\n"); err == nil && plain == s && !strings.ContainsAny(s, "\n#") {
		return plain
	}
	return strconv.Quote(s)
}
