package settings

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
	yamlv3 "go.yaml.in/yaml/v3"
)

// LoadOptions is everything Load reads; it never looks at the process
// environment itself, so tests inject it.
type LoadOptions struct {
	// Flags is a parsed set with RegisterFlags' flags; only flags actually
	// given count. Nil means no flags.
	Flags *pflag.FlagSet
	// Environ is "NAME=value" pairs (os.Environ()); nil means none.
	Environ []string
	// ConfigPath, when not empty, is the settings file to read, overriding
	// --config, $KVDOCK_CONFIG and the XDG default.
	ConfigPath string
}

// Loaded is the result of Load.
type Loaded struct {
	Config Config
	// Sources holds the source of every key, by dotted key ("l1.size_gb").
	Sources map[string]Source
	// File is the settings file read, "" when none.
	File string
	// FileSource says how File was chosen (--config, $KVDOCK_CONFIG, the
	// XDG default); zero when File is "".
	FileSource Source
	// Warnings are things worth logging that are not errors: KVDOCK_*
	// variables that name no setting.
	Warnings []string
}

// Load layers defaults < settings file < environment < flags given, decodes
// every key, validates the result and records where each value came from.
// Settings problems (unknown file keys, wrong types, broken rules, in every
// layer) come back together as a *ValidationError; an unreadable file or
// invalid YAML comes back as a plain error naming the file and line. With a
// *ValidationError the Loaded is returned as well, every key that decoded
// set (see ValidationError.Problems for the keys that are wrong); with any
// other error it is nil.
func Load(opts LoadOptions) (*Loaded, error) {
	path, pathSrc, err := ResolvePath(opts)
	if err != nil {
		return nil, err
	}
	defs := table()
	defaults, err := defaultsLayer(defs)
	if err != nil {
		return nil, err
	}
	fileK, fileLines, probs, err := fileLayer(path, pathSrc)
	if err != nil {
		return nil, err
	}
	envK, envNames, warnings, err := envLayer(defs, opts.Environ)
	if err != nil {
		return nil, err
	}
	flagK, flagNames, flagProbs, err := flagLayer(defs, opts.Flags)
	if err != nil {
		return nil, err
	}
	probs = append(probs, flagProbs...)

	merged := koanf.New(".")
	for _, layer := range []*koanf.Koanf{defaults, fileK, envK, flagK} {
		if err := merged.Merge(layer); err != nil {
			return nil, fmt.Errorf("merging settings: %w", err)
		}
	}

	out := &Loaded{Config: Default(), Sources: map[string]Source{}, File: path, Warnings: warnings}
	if path != "" {
		out.FileSource = pathSrc
	}
	l := layers{path: path, fileLines: fileLines, envK: envK, envNames: envNames, flagK: flagK, flagNames: flagNames, merged: merged}
	skip, aprobs := l.assign(defs, out, opts.Environ)
	probs = append(probs, aprobs...)
	probs = append(probs, validate(out.Config, out.Sources, skip)...)
	if len(probs) > 0 {
		// The values come back too: a client such as kvdock ctl reads the
		// few keys it needs even when keys it does not use are broken.
		return out, &ValidationError{Problems: probs}
	}
	return out, nil
}

// defaultsLayer is the lowest layer: every key's default but the autos
// (absent) and the tiers (none).
func defaultsLayer(defs []keyDef) (*koanf.Koanf, error) {
	defaults := koanf.New(".")
	flat := map[string]any{}
	defCfg := Default()
	for _, d := range defs {
		if p, ok := d.field(&defCfg).(**string); ok && *p == nil {
			continue // absent means auto
		}
		if _, ok := d.field(&defCfg).(*[]Adapter); ok {
			continue // no tiers by default
		}
		flat[d.key] = derefField(d.field(&defCfg))
	}
	if err := defaults.Load(confmap.Provider(flat, "."), nil); err != nil {
		return nil, fmt.Errorf("loading defaults: %w", err)
	}
	return defaults, nil
}

// fileLayer is the settings file at path ("" = none), with each key's line
// and the file's problems.
func fileLayer(path string, pathSrc Source) (*koanf.Koanf, map[string]fileLeaf, []Problem, error) {
	fileK := koanf.New(".")
	fileLines := map[string]fileLeaf{}
	if path == "" {
		return fileK, fileLines, nil, nil
	}
	data, err := file.Provider(path).ReadBytes()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("settings file %s (from %s): %w", path, pathSrc, err)
	}
	lines, fprobs, err := checkFile(path, data)
	if err != nil {
		return nil, nil, nil, err
	}
	// A file with structural problems (a list at the top, a key given
	// twice) may not decode as a map; those problems already say why.
	if err := fileK.Load(bytesProvider(data), yaml.Parser()); err != nil && len(fprobs) == 0 {
		return nil, nil, nil, fmt.Errorf("settings file %s: %w", path, err)
	}
	return fileK, lines, fprobs, nil
}

// envLayer is the KVDOCK_* variables, with the variable that set each key
// and a warning for each that names no setting.
func envLayer(defs []keyDef, environ []string) (*koanf.Koanf, map[string]string, []string, error) {
	envK := koanf.New(".")
	envNames := map[string]string{}
	byEnv := map[string]string{}
	for _, d := range defs {
		byEnv[d.env()] = d.key
	}
	var warnings []string
	envProv := env.Provider(".", env.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, value string) (string, any) {
			key, ok := byEnv[name]
			if !ok {
				if name != EnvConfig && name != EnvRespUsername && name != EnvRespPassword {
					warnings = append(warnings, fmt.Sprintf("%s names no setting; ignored", name))
				}
				return "", nil
			}
			envNames[key] = name
			return key, value
		},
	})
	if err := envK.Load(envProv, nil); err != nil {
		return nil, nil, nil, fmt.Errorf("reading environment: %w", err)
	}
	return envK, envNames, warnings, nil
}

// flagLayer is the flags given (flags may be nil), with the flag that set
// each key and a problem for each key two flags set.
func flagLayer(defs []keyDef, flags *pflag.FlagSet) (*koanf.Koanf, map[string]string, []Problem, error) {
	flagK := koanf.New(".")
	flagNames := map[string]string{}
	if flags == nil {
		return flagK, flagNames, nil, nil
	}
	var probs []Problem
	byFlag := map[string]keyDef{}
	for _, d := range defs {
		byFlag[d.flag] = d
		if d.negatable {
			byFlag["no-"+d.flag] = d
		}
	}
	prov := posflag.ProviderWithFlag(flags, ".", nil, func(f *pflag.Flag) (string, any) {
		d, ok := byFlag[f.Name]
		if !ok || !f.Changed {
			return "", nil
		}
		val := posflag.FlagVal(flags, f)
		if d.key == KeyAdapters {
			list, err := flags.GetStringArray(f.Name)
			if err != nil {
				return "", nil
			}
			val = list
		}
		if f.Name != d.flag {
			b, _ := val.(bool)
			val = !b
		}
		if prev, dup := flagNames[d.key]; dup {
			probs = append(probs, Problem{Key: d.key, Source: Source{Kind: SourceFlag, Detail: "--" + f.Name},
				Reason: fmt.Sprintf("conflicts with %s; give one of them", prev)})
		}
		flagNames[d.key] = "--" + f.Name
		return d.key, val
	})
	if err := flagK.Load(prov, nil); err != nil {
		return nil, nil, nil, fmt.Errorf("reading flags: %w", err)
	}
	return flagK, flagNames, probs, nil
}

// layers is what the layers say about each key: where it was set and the
// merged value.
type layers struct {
	path        string
	fileLines   map[string]fileLeaf
	envK, flagK *koanf.Koanf
	envNames    map[string]string
	flagNames   map[string]string
	merged      *koanf.Koanf
}

// assign gives each key of out.Config its value and out.Sources its source;
// skip holds the keys whose value was refused (validate passes them over).
func (l layers) assign(defs []keyDef, out *Loaded, environ []string) (skip map[string]bool, probs []Problem) {
	// l2.adapters is checked field by field as it is read, each problem
	// with its own source.
	skip = map[string]bool{KeyAdapters: true}
	for _, d := range defs {
		var src Source
		switch {
		case l.flagNames[d.key] != "":
			src = Source{Kind: SourceFlag, Detail: l.flagNames[d.key]}
		case l.envNames[d.key] != "":
			src = Source{Kind: SourceEnv, Detail: l.envNames[d.key]}
		case l.fileLines[d.key].line > 0:
			src = Source{Kind: SourceFile, Detail: fmt.Sprintf("%s:%d", l.path, l.fileLines[d.key].line)}
		default:
			out.Sources[d.key] = Source{Kind: SourceDefault}
			continue
		}
		out.Sources[d.key] = src
		if d.key == KeyAdapters {
			var v any
			switch src.Kind {
			case SourceFlag:
				v = l.flagK.Get(d.key)
			case SourceEnv:
				v = l.envK.Get(d.key)
			}
			list, aprobs := loadAdapters(v, src, l.path, l.fileLines[d.key].items, environ)
			out.Config.L2.Adapters = list
			probs = append(probs, aprobs...)
			continue
		}
		v := l.merged.Get(d.key)
		if src.Kind == SourceFile && v != nil {
			// A string key keeps the text as written: YAML would make
			// "token: 0x1F" the number 31.
			switch d.field(&out.Config).(type) {
			case *string, **string:
				v = l.fileLines[d.key].raw
			}
		}
		if reason := assign(d.field(&out.Config), v); reason != "" {
			shown := rawDisplay(v)
			if d.secret {
				shown = Redacted
			}
			probs = append(probs, Problem{Key: d.key, Value: shown, Source: src, Reason: reason})
			skip[d.key] = true
			continue
		}
		d.canon(&out.Config)
	}
	return skip, probs
}

func derefField(ptr any) any {
	switch p := ptr.(type) {
	case *string:
		return *p
	case **string:
		return **p
	case *int:
		return *p
	case *int64:
		return *p
	case *float64:
		return *p
	case *bool:
		return *p
	}
	// time.Duration is the only other kind.
	return text(ptr)
}

// bytesProvider hands koanf the file bytes already read and checked, so the
// file is read once.
type bytesProvider []byte

func (b bytesProvider) ReadBytes() ([]byte, error) { return b, nil }

func (b bytesProvider) Read() (map[string]any, error) {
	return nil, errors.New("bytes provider does not support Read")
}

// fileLeaf is a valid leaf of the settings file: the line of its key and
// its value as written.
type fileLeaf struct {
	line  int
	raw   string
	items []fileItem // l2.adapters only
}

// checkFile parses the YAML with positions, returning every valid leaf key and a problem for every unknown or misshapen one. Invalid
// YAML is an error carrying the line.
func checkFile(path string, data []byte) (map[string]fileLeaf, []Problem, error) {
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(data, &doc); err != nil {
		return nil, nil, fmt.Errorf("settings file %s: %w", path, err)
	}
	lines := map[string]fileLeaf{}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return lines, nil, nil // empty, or only comments
	}
	at := func(n *yamlv3.Node) Source {
		return Source{Kind: SourceFile, Detail: fmt.Sprintf("%s:%d", path, n.Line)}
	}
	root := deref(doc.Content[0])
	if isNull(root) {
		return lines, nil, nil
	}
	groups := strings.Join(groupOrder[:], ", ")
	if root.Kind != yamlv3.MappingNode {
		return lines, []Problem{{Key: "settings file", Source: at(root), Reason: "must be a mapping of groups: " + groups}}, nil
	}
	leaves := map[string][]string{}
	for _, d := range table() {
		leaves[d.group()] = append(leaves[d.group()], d.leaf())
	}
	var probs []Problem
	seen := map[string]int{}
	bad := map[string]bool{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := deref(root.Content[i]), deref(root.Content[i+1])
		group := k.Value
		if _, ok := leaves[group]; !ok || k.Kind != yamlv3.ScalarNode {
			probs = append(probs, Problem{Key: group, Source: at(k), Reason: "unknown group; accepted: " + groups})
			continue
		}
		if first, dup := seen[group]; dup {
			probs = append(probs, Problem{Key: group, Source: at(k), Reason: fmt.Sprintf("group given twice (first at line %d)", first)})
			continue
		}
		seen[group] = k.Line
		if isNull(v) {
			continue
		}
		if v.Kind != yamlv3.MappingNode {
			probs = append(probs, Problem{Key: group, Source: at(v), Reason: "must be a mapping of keys: " + strings.Join(leaves[group], ", ")})
			continue
		}
		for j := 0; j+1 < len(v.Content); j += 2 {
			lk, lv := deref(v.Content[j]), deref(v.Content[j+1])
			key := group + "." + lk.Value
			if !known(leaves[group], lk.Value) || lk.Kind != yamlv3.ScalarNode {
				probs = append(probs, Problem{Key: key, Source: at(lk),
					Reason: fmt.Sprintf("unknown key; %s accepts: %s", group, strings.Join(leaves[group], ", "))})
				continue
			}
			if first, dup := lines[key]; dup {
				probs = append(probs, Problem{Key: key, Source: at(lk), Reason: fmt.Sprintf("key given twice (first at line %d)", first.line)})
				continue
			}
			if key == KeyAdapters {
				switch {
				case isNull(lv):
					lines[key] = fileLeaf{line: lk.Line}
				case lv.Kind != yamlv3.SequenceNode:
					probs = append(probs, Problem{Key: key, Source: at(lk), Reason: "must be a list of adapter mappings (- type: fs …)"})
					bad[key] = true
					lines[key] = fileLeaf{line: lk.Line}
				default:
					lines[key] = fileLeaf{line: lk.Line, items: fileAdapters(lv)}
				}
				continue
			}
			if lv.Kind != yamlv3.ScalarNode {
				probs = append(probs, Problem{Key: key, Source: at(lk), Reason: "must be a single value, not a list or mapping"})
				bad[key] = true
			}
			lines[key] = fileLeaf{line: lk.Line, raw: lv.Value}
		}
	}
	for k := range bad {
		delete(lines, k) // seen, but not a value to use
	}
	return lines, probs, nil
}

func deref(n *yamlv3.Node) *yamlv3.Node {
	// Aliases may chain; yaml.v3 rejects cycles while parsing.
	for i := 0; n != nil && n.Kind == yamlv3.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yamlv3.Node) bool {
	return n.Kind == yamlv3.ScalarNode && n.Tag == "!!null"
}

func known(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

// envLookup finds name in environ; the last occurrence wins, as with the
// env provider.
func envLookup(environ []string, name string) (string, bool) {
	val, found := "", false
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			val, found = v, true
		}
	}
	return val, found
}

// DefaultPath is where kvdock looks for its settings file when told
// nothing: $XDG_CONFIG_HOME/kvdock/config.yaml, else
// $HOME/.config/kvdock/config.yaml, both read from environ.
func DefaultPath(environ []string) (string, error) {
	if x, ok := envLookup(environ, "XDG_CONFIG_HOME"); ok && filepath.IsAbs(x) {
		return filepath.Join(x, "kvdock", "config.yaml"), nil
	}
	if h, ok := envLookup(environ, "HOME"); ok && h != "" {
		return filepath.Join(h, ".config", "kvdock", "config.yaml"), nil
	}
	return "", errors.New("neither $XDG_CONFIG_HOME nor $HOME is set, so there is no default settings path")
}

// ResolvePath picks the settings file: opts.ConfigPath, else --config, else
// $KVDOCK_CONFIG, else DefaultPath when that file exists. An empty --config
// or $KVDOCK_CONFIG means no file. A file named explicitly must exist.
// It returns "" when there is no file to read.
func ResolvePath(opts LoadOptions) (string, Source, error) {
	explicit := func(p string, src Source) (string, Source, error) {
		if p == "" {
			return "", src, nil
		}
		if _, err := os.Stat(p); err != nil {
			return "", src, fmt.Errorf("settings file %s (from %s): %w", p, src, err)
		}
		return p, src, nil
	}
	if opts.ConfigPath != "" {
		return explicit(opts.ConfigPath, Source{Kind: SourceFlag, Detail: "command line"})
	}
	if opts.Flags != nil {
		if f := opts.Flags.Lookup(ConfigFlag); f != nil && f.Changed {
			return explicit(f.Value.String(), Source{Kind: SourceFlag, Detail: "--" + ConfigFlag})
		}
	}
	if p, ok := envLookup(opts.Environ, EnvConfig); ok {
		return explicit(p, Source{Kind: SourceEnv, Detail: EnvConfig})
	}
	p, err := DefaultPath(opts.Environ)
	if err != nil {
		return "", Source{}, nil // nowhere to look: run on defaults
	}
	src := Source{Kind: SourceDefault, Detail: "default path"}
	if _, err := os.Stat(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", Source{}, nil
		}
		return "", src, fmt.Errorf("settings file %s: %w", p, err)
	}
	return p, src, nil
}
