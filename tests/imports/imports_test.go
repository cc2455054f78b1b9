// Package imports checks the direction of imports DESIGN.md sets: one table
// of rules, checked against what `go list` says every package of the module
// imports (test files aside: a test may drive its package with others).
package imports

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// module is the module path; rules name packages relative to it ("main" is
// the root package), and "x/..." names x and every package below it.
const module = "kvdock"

// rule constrains the imports of ours of the packages pkg names: only the
// packages in only (when only is not nil; an empty list allows none), and
// never the packages in never but those in except.
type rule struct {
	pkg    string
	only   []string
	never  []string
	except []string
	why    string
}

// leaf is a rule for a core leaf: settings and the listed leaf types at most.
func leaf(pkg string, built ...string) rule {
	return rule{pkg: pkg, only: append([]string{"settings"}, built...),
		why: "a core leaf imports at most settings and the leaf types it is built on"}
}

// bare is a rule for a core leaf that takes its own defaults: the listed
// leaf types at most, not settings (its options flow from settings through
// the engine, never back).
func bare(pkg string, built ...string) rule {
	return rule{pkg: pkg, only: append([]string{}, built...),
		why: "this core leaf keeps its own defaults and imports no settings, only the leaf types it is built on"}
}

// rules is the import direction of DESIGN.md. Every package under core/ must
// match an allow-list rule here, so a new core package states its place.
var rules = []rule{
	{pkg: "settings", only: []string{}, why: "settings imports nothing of ours"},
	{pkg: "assets", only: []string{}, why: "assets is data only: it imports no package of ours"},
	{pkg: "core/l1/...", only: []string{"core/l1/...", "core/keys", "core/layout"},
		why: "core/l1 reports through its observer and imports no other core package beyond the key and layout types it stores"},
	bare("core/keys"),
	leaf("core/layout"),
	leaf("core/hostmem"),
	leaf("core/gpu"),
	bare("core/logcap"),
	leaf("core/portholder"),
	leaf("core/series"),
	leaf("core/tierstate"),
	bare("core/protocol"),
	leaf("core/misses", "core/keys"),
	// The what-if plays the prefix policy's order, core/l1/nextuse: a leaf
	// of no imports, shared so that the two cannot drift apart.
	bare("core/whatif", "core/keys", "core/l1/nextuse"),
	bare("core/zmqwait"),
	bare("core/kvevents", "core/keys", "core/zmqwait"),
	leaf("core/workers", "core/layout"),
	bare("core/lookup", "core/keys", "core/layout", "core/misses", "core/whatif"),
	leaf("core/restart", "core/keys", "core/l1", "core/protocol", "core/misses", "core/series"),
	bare("core/rpc/...", "core/protocol", "core/rpc/..."),
	{pkg: "core/testkit/...", only: []string{"settings", "assets", "core/testkit/...", "core/keys", "core/layout", "core/l1/...", "core/protocol"},
		why: "test kits build on the leaves they help test (keys, layouts, a pool, a profile), never on the engine, the transfer modules or the faces"},
	{pkg: "core/engine/...", only: []string{"settings", "assets", "core/...", "transfer/..."},
		why: "the engine wires core and the transfer modules, and knows no screen"},
	{pkg: "transfer/...", never: []string{"core/engine/...", "ui/...", "main"},
		why: "transfer modules import core leaves; the engine wires them"},
	{pkg: "ui/...", never: []string{"transfer/..."}, except: []string{"transfer/worker"},
		why: "the faces read the engine's snapshots and types (they live in core); the worker client is the one transfer package they drive"},
}

// match reports whether the package rel (relative to the module) is named
// by pattern.
func match(pattern, rel string) bool {
	if tree, ok := strings.CutSuffix(pattern, "/..."); ok {
		return rel == tree || strings.HasPrefix(rel, tree+"/")
	}
	return rel == pattern
}

func matchAny(patterns []string, rel string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return match(p, rel) })
}

// relative is path relative to the module ("main" for its root), ok false
// for packages outside it.
func relative(path string) (string, bool) {
	if path == module {
		return "main", true
	}
	rel, ok := strings.CutPrefix(path, module+"/")
	return rel, ok
}

// violations checks the packages (import path → its imports) against rs.
func violations(rs []rule, pkgs map[string][]string) []string {
	var out []string
	for path, imports := range pkgs {
		rel, ok := relative(path)
		if !ok {
			continue
		}
		placed := false
		for _, r := range rs {
			if !match(r.pkg, rel) {
				continue
			}
			placed = placed || r.only != nil
			for _, imp := range imports {
				dep, ours := relative(imp)
				if !ours {
					continue
				}
				if (r.only != nil && !matchAny(r.only, dep)) || (matchAny(r.never, dep) && !matchAny(r.except, dep)) {
					out = append(out, fmt.Sprintf("%s imports %s: %s (rule %q)", rel, dep, r.why, r.pkg))
				}
			}
		}
		if strings.HasPrefix(rel, "core/") && !placed {
			out = append(out, fmt.Sprintf("%s: a core package no allow-list rule names; add it to the table", rel))
		}
	}
	slices.Sort(out)
	return out
}

// listImports asks the go tool for every package of the module and its
// imports (test files aside).
func listImports(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	pkgs := make(map[string][]string)
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs[p.ImportPath] = p.Imports
	}
	for _, want := range []string{module + "/settings", module + "/core/l1", module + "/core/engine", module + "/assets"} {
		if _, ok := pkgs[want]; !ok {
			t.Fatalf("go list did not report %s: %d packages", want, len(pkgs))
		}
	}
	return pkgs
}

func TestImportDirection(t *testing.T) {
	for _, v := range violations(rules, listImports(t)) {
		t.Error(v)
	}
}

// The rules catch each kind of violation, and a new core package must be
// placed in the table.
func TestRulesCatchViolations(t *testing.T) {
	bad := map[string][]string{
		"kvdock/settings":         {"fmt", "kvdock/core/keys"},
		"kvdock/assets":           {"embed", "kvdock/core/protocol"},
		"kvdock/core/l1":          {"kvdock/core/keys", "kvdock/core/l1/alloc", "kvdock/core/whatif"},
		"kvdock/core/l1/segment":  {"kvdock/core/hostmem"},
		"kvdock/core/misses":      {"kvdock/core/keys", "kvdock/core/l1"},
		"kvdock/core/engine":      {"kvdock/core/l1", "kvdock/ui/dashboard"},
		"kvdock/ui/httpapi":       {"kvdock/core/engine", "kvdock/transfer/nongpu"},
		"kvdock/ui/bench":         {"kvdock/transfer/worker", "kvdock/transfer/tier/resp"},
		"kvdock/transfer/nongpu":  {"kvdock/core/engine"},
		"kvdock/core/newthing":    {"fmt"},
		"kvdock/core/keys":        {"kvdock/settings"},
		"github.com/other/module": {"kvdock/ui/dashboard"},
	}
	want := []string{"assets imports core/protocol", "core/engine imports ui/dashboard", "core/l1 imports core/whatif",
		"core/l1/segment imports core/hostmem", "core/misses imports core/l1", "core/newthing: a core package",
		"settings imports core/keys", "transfer/nongpu imports core/engine", "ui/httpapi imports transfer/nongpu",
		"core/keys imports settings", "ui/bench imports transfer/tier/resp"}
	got := violations(rules, bad)
	for _, w := range want {
		if !slices.ContainsFunc(got, func(g string) bool { return strings.HasPrefix(g, w) }) {
			t.Errorf("no violation %q in:\n%s", w, strings.Join(got, "\n"))
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d violations, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
}
