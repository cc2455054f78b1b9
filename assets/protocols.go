// Package assets holds the files kvdock embeds: protocol profile tables, the
// annotated default configuration and other shipped artefacts. It is data
// only and imports no package of kvdock: core/protocol parses the tables.
package assets

import (
	"embed"
	"fmt"
	"path"
	"slices"
	"strings"
)

//go:embed protocols/*.yaml
var protocolFS embed.FS

// Protocol returns the YAML table of the named protocol profile
// (assets/protocols/<name>.yaml), for core/protocol.Load.
func Protocol(name string) ([]byte, error) {
	if name == "" || strings.ContainsAny(name, "/\\.") {
		return nil, fmt.Errorf("protocol profile %q: not a profile name (known: %s)", name, strings.Join(ProtocolNames(), ", "))
	}
	b, err := protocolFS.ReadFile(path.Join("protocols", name+".yaml"))
	if err != nil {
		return nil, fmt.Errorf("protocol profile %q: unknown (known: %s)", name, strings.Join(ProtocolNames(), ", "))
	}
	return b, nil
}

// ProtocolNames lists the embedded protocol profiles, sorted.
func ProtocolNames() []string {
	entries, err := protocolFS.ReadDir("protocols")
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".yaml"); ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}
