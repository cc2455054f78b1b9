package settings

// The L2 tier settings: the typed adapter definitions the tier packages
// take, the adapter list as given (repeatable --l2-adapter JSON,
// KVDOCK_L2_ADAPTERS as a JSON array, l2.adapters in the file as a list of
// objects), their validation (every problem at once, with its source), the
// credentials read from the environment, and their redaction.

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
)

// L2Config is the L2 tiers behind the L1 pool.
type L2Config struct {
	// Adapters are the tiers in lookup order (the first is tried first).
	// After Load, resp credentials missing from an adapter are filled from
	// the environment.
	Adapters []Adapter `koanf:"adapters"`
	// StorePolicy is "write-behind" (published L1 chunks are queued for the
	// tiers) or "none" (tiers are only read).
	StorePolicy         string  `koanf:"store_policy"`
	PrefetchMaxInFlight int     `koanf:"prefetch_max_in_flight"`
	LoadTimeoutSeconds  float64 `koanf:"load_timeout_seconds"`
	// QueueBytes bounds the write-behind queue; past it writes are dropped.
	QueueBytes int64 `koanf:"queue_bytes"`
}

// Adapter is one L2 tier: Type ("fs" or "resp") says which of FS and RESP
// holds its fields; the other stays zero.
type Adapter struct {
	Type string
	FS   FSAdapter
	RESP RESPAdapter
}

// FSAdapter is a {"type": "fs", …} tier (upstream LMCache's
// FSL2AdapterConfig names): one file per chunk under BasePath. The JSON
// names are the adapter's fields; a zero field takes the tier's default.
// Upstream's read_ahead_size and use_odirect are refused with the reason.
type FSAdapter struct {
	BasePath string `json:"base_path,omitempty"` // required; created 0700 when missing
	// MaxCapacityGB (GiB) is enforced by LRU eviction of the tier's own
	// files. Upstream's 0 = unbounded is refused: every tier is bounded.
	MaxCapacityGB float64 `json:"max_capacity_gb,omitempty"`
	// RelativeTmpDir is a sub-directory of BasePath where writes are staged
	// before the rename into place; "" = the chunk's own shard directory.
	RelativeTmpDir string `json:"relative_tmp_dir,omitempty"`
	// RecoverOnStart (also upstream's older scan_on_startup) rebuilds the
	// index from a previous run's files; nil = true. false starts cold and
	// removes those files.
	RecoverOnStart *bool `json:"recover_on_start,omitempty"`
	// KVEventsMedium is the medium of this tier's KV events; "" = STORAGE.
	KVEventsMedium string `json:"kv_events_medium,omitempty"`
}

// RESPAdapter is a {"type": "resp", …} tier on Redis or Valkey. The JSON
// names are the adapter's fields; a zero field takes the tier's default.
type RESPAdapter struct {
	Host          string   `json:"host,omitempty"` // one server; "" only with Cluster
	Port          int      `json:"port,omitempty"`
	Username      string   `json:"username,omitempty"`        // missing: from the environment
	Password      string   `json:"password,omitempty"`        // secret; missing: from the environment
	MaxCapacityGB float64  `json:"max_capacity_gb,omitempty"` // budget of this process's own writes
	NumWorkers    int      `json:"num_workers,omitempty"`     // calls in flight at once
	TLS           bool     `json:"tls,omitempty"`
	CAFile        string   `json:"ca_file,omitempty"` // PEM roots for TLS; "" = the system's
	Cluster       bool     `json:"cluster,omitempty"`
	StartupNodes  []string `json:"startup_nodes,omitempty"` // "host:port" seeds, with Cluster only
	KeyPrefix     *string  `json:"key_prefix,omitempty"`
	TTLSeconds    int      `json:"ttl_seconds,omitempty"` // 0 = values never expire
	// KVEventsMedium is the medium of this tier's KV events; "" = STORAGE.
	KVEventsMedium string `json:"kv_events_medium,omitempty"`
}

// KVEventsMedium is the medium a's values are announced for in the KV
// event stream: its kv_events_medium, else "STORAGE".
func (a Adapter) KVEventsMedium() string {
	return cmp.Or(a.FS.KVEventsMedium, a.RESP.KVEventsMedium, "STORAGE")
}

// KeyAdapters is the dotted key of the adapter list.
const KeyAdapters = "l2.adapters"

// The environment variables resp credentials may come from, upstream's
// names first; kvdock's own win when both are set.
const (
	EnvRespUsername         = EnvPrefix + "RESP_USERNAME"
	EnvRespPassword         = EnvPrefix + "RESP_PASSWORD"
	EnvUpstreamRespUsername = "LMCACHE_RESP_USERNAME"
	EnvUpstreamRespPassword = "LMCACHE_RESP_PASSWORD"
)

// Bounds: every tier is a lookup step; a flag's JSON and the env's array
// are read whole; a cluster's seeds are dialled.
const (
	maxAdapters     = 16
	maxAdapterText  = 64 << 10
	maxStartupNodes = 64
	maxTTLSeconds   = 10 * 365 * 24 * 3600
)

// adapterTypes lists the accepted types.
const adapterTypes = `"fs", "resp"`

// body is the typed struct of a's type.
func (a *Adapter) body() (reflect.Value, bool) {
	switch a.Type {
	case "fs":
		return reflect.ValueOf(&a.FS).Elem(), true
	case "resp":
		return reflect.ValueOf(&a.RESP).Elem(), true
	}
	return reflect.Value{}, false
}

// fieldNames are a body's adapter field names, in declaration order.
func fieldNames(body reflect.Value) []string {
	var out []string
	for f := range body.Type().Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		out = append(out, name)
	}
	return out
}

// upstreamField is the field an older upstream name stands for, or why
// kvdock refuses an upstream field.
func upstreamField(typ, field string) (alias, refused string) {
	switch typ + "." + field {
	case "fs.scan_on_startup":
		return "recover_on_start", ""
	case "fs.read_ahead_size":
		return "", "not supported by kvdock's fs tier (a read-ahead hint for network file systems; each value is read with one request)"
	case "fs.use_odirect":
		return "", "not supported by kvdock's fs tier (O_DIRECT needs block-aligned buffers and lengths, which values carrying a header are not)"
	}
	return "", ""
}

// fieldChecks are the checks of the adapter fields on a given value, by
// "type.field"; "" = fine.
func fieldChecks() map[string]func(v any) string {
	nonEmptyText := func(v any) string { return nonEmpty(strings.TrimSpace(v.(string))) }
	capacity := func(minGB float64) func(any) string {
		return func(v any) string {
			if f := v.(float64); !(f > 0) || f > maxSizeGB {
				return fmt.Sprintf("must be > 0 and <= %d (GiB); upstream's 0 = unbounded is not supported: every tier is bounded", maxSizeGB)
			} else if f < minGB {
				return fmt.Sprintf("%v GiB is under 1 MiB", f)
			}
			return ""
		}
	}
	return map[string]func(any) string{
		"fs.base_path":       func(v any) string { return cmp.Or(nonEmptyText(v), noNUL(v.(string))) },
		"fs.max_capacity_gb": capacity(1.0 / 1024),
		"fs.relative_tmp_dir": func(v any) string {
			d, c := v.(string), filepath.Clean(v.(string))
			if filepath.IsAbs(d) || c == "." || slices.Contains(strings.Split(c, "/"), "..") || noNUL(d) != "" {
				return `want a sub-directory of base_path (relative, no "..")`
			}
			return ""
		},
		"resp.ca_file": nonEmptyText,
		"resp.host": func(v any) string {
			if strings.ContainsAny(v.(string), " /\t\r\n") {
				return "is not a host name or address"
			}
			return nonEmptyText(v)
		},
		"resp.max_capacity_gb":  capacity(0),
		"resp.num_workers":      func(v any) string { return intRange(v.(int), 1, 1024) },
		"resp.port":             func(v any) string { return intRange(v.(int), 1, 65535) },
		"resp.startup_nodes":    checkNodes,
		"resp.ttl_seconds":      func(v any) string { return intRange(v.(int), 0, maxTTLSeconds) },
		"fs.kv_events_medium":   mediumName,
		"resp.kv_events_medium": mediumName,
	}
}

// mediumName checks a KV events medium name: 1..64 printable ASCII bytes,
// as a router shows and compares it.
func mediumName(v any) string {
	s := v.(string)
	if s == "" || len(s) > 64 || strings.IndexFunc(s, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
		return "must be 1..64 printable ASCII bytes without spaces, such as \"STORAGE\""
	}
	return ""
}

func noNUL(s string) string {
	if strings.IndexByte(s, 0) >= 0 {
		return "contains a NUL byte"
	}
	return ""
}

func checkNodes(v any) string {
	nodes := v.([]string)
	if len(nodes) == 0 || len(nodes) > maxStartupNodes {
		return fmt.Sprintf(`must list 1..%d "host:port" nodes`, maxStartupNodes)
	}
	for _, n := range nodes {
		host, port, err := net.SplitHostPort(n)
		p, perr := strconv.Atoi(port)
		if err != nil || host == "" || perr != nil || p < 1 || p > 65535 {
			return fmt.Sprintf(`%q is not "host:port" with a port in 1..65535`, n)
		}
	}
	return ""
}

// setField stores a value as decoded from JSON or YAML into a field of a
// body; the reason when its kind does not fit.
func setField(field reflect.Value, v any) string {
	if v != nil {
		b, err := json.Marshal(v)
		p := reflect.New(field.Type())
		if err == nil && json.Unmarshal(b, p.Interface()) == nil {
			field.Set(p.Elem())
			return ""
		}
	}
	return map[string]string{
		"string": "must be a string", "int": "must be a whole number", "float64": "must be a finite number",
		"bool": "must be true or false", "[]string": `must be a list of "host:port" strings`,
	}[strings.TrimPrefix(field.Type().String(), "*")]
}

// fieldProblem is a problem of one adapter field ("" = the whole adapter).
type fieldProblem struct {
	field, reason string
	value         any // as given; nil when not about a value
}

// checkAdapter decodes one adapter as given into its typed form and checks
// each field given and the rules between fields: every problem, one per
// field.
func checkAdapter(r rawAdapter) (Adapter, []fieldProblem) {
	typ, _ := r.fields["type"].(string)
	a := Adapter{Type: typ}
	body, known := a.body()
	if !known {
		return a, []fieldProblem{{field: "type", value: r.fields["type"], reason: "accepted: " + adapterTypes}}
	}
	names, checks := fieldNames(body), fieldChecks()
	given := map[string]bool{}
	var probs []fieldProblem
	bad := func(field string, v any, reason string) {
		if !slices.ContainsFunc(probs, func(p fieldProblem) bool { return p.field == field }) {
			probs = append(probs, fieldProblem{field: field, value: v, reason: reason})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(r.fields)) {
		v, i := r.fields[name], slices.Index(names, name)
		alias, refused := upstreamField(typ, name)
		if alias != "" {
			i = slices.Index(names, alias)
		}
		switch {
		case name == "type":
			continue
		case refused != "":
			bad(name, v, refused)
			continue
		case i < 0:
			bad(name, nil, fmt.Sprintf("unknown field of a %q adapter; accepted: type, %s", typ, strings.Join(names, ", ")))
			continue
		}
		field := body.Field(i)
		if text, ok := r.raw[name]; ok && strings.HasSuffix(field.Type().String(), "string") {
			v = text // as written: YAML would read 0123 as 83
		}
		before := field.Interface()
		if reason := setField(field, v); reason != "" {
			bad(name, v, reason)
		} else if alias != "" && given[alias] && !reflect.DeepEqual(before, field.Interface()) {
			bad(name, v, "disagrees with "+alias+" (another name for it)")
		} else if check := checks[typ+"."+names[i]]; check != nil {
			if reason := check(field.Interface()); reason != "" {
				bad(name, v, reason)
			}
		}
		given[names[i]] = true
	}
	// The rules between fields.
	rule := func(broken bool, field, reason string) {
		if broken {
			bad(field, nil, reason)
		}
	}
	rs := a.RESP
	rule(typ == "fs" && a.FS.BasePath == "", "base_path", `required for an "fs" adapter`)
	rule(typ == "resp" && rs.Cluster && len(rs.StartupNodes) == 0, "startup_nodes", `required with "cluster": true (the seed nodes, "host:port" each)`)
	rule(typ == "resp" && rs.Cluster && (rs.Host != "" || rs.Port != 0), "host", `not used with "cluster": true; list every seed node in startup_nodes`)
	rule(typ == "resp" && !rs.Cluster && len(rs.StartupNodes) > 0, "startup_nodes", `only used with "cluster": true; give host and port for one server`)
	rule(typ == "resp" && !rs.Cluster && rs.Host == "", "host", `required for a resp adapter (or "cluster": true with startup_nodes)`)
	rule(rs.CAFile != "" && !rs.TLS, "ca_file", `only used with "tls": true`)
	return a, probs
}

// checkAdapters decodes and checks adapters as given and returns the
// adapters without problems and every problem found, each with its source.
func checkAdapters(list []rawAdapter, at adapterSource) ([]Adapter, []Problem) {
	if len(list) > maxAdapters {
		return nil, []Problem{{Key: KeyAdapters, Source: at(0, ""), Reason: fmt.Sprintf("%d adapters given; at most %d", len(list), maxAdapters)}}
	}
	var out []Adapter
	var probs []Problem
	paths := map[string]int{}
	for i, r := range list {
		a, found := Adapter{}, []fieldProblem{{reason: r.bad}}
		if r.bad == "" {
			a, found = checkAdapter(r)
		}
		if p := a.FS.BasePath; a.Type == "fs" && p != "" {
			if first, dup := paths[p]; dup {
				found = append(found, fieldProblem{field: "base_path", value: p,
					reason: fmt.Sprintf("already used by %s[%d]; two tiers must not share a directory", KeyAdapters, first)})
			}
			paths[p] = i
		}
		for _, fp := range found {
			key, shown := fmt.Sprintf("%s[%d]", KeyAdapters, i), ""
			if fp.field != "" {
				key += "." + fp.field
			}
			if fp.value != nil {
				shown = jsonText(fp.value)
				if fp.field == "username" || fp.field == "password" {
					shown = Redacted
				}
			}
			probs = append(probs, Problem{Key: key, Value: shown, Source: at(i, fp.field), Reason: fp.reason})
		}
		if len(found) == 0 {
			out = append(out, a)
		}
	}
	return out, probs
}

// adapterSource says where adapter i came from, and the line of a field
// when the file gave it.
type adapterSource func(i int, field string) Source

// rawAdapter is one adapter as given: field → value (strings, float64/int
// numbers, bools, []any), plus, for a file, each scalar's text as written.
type rawAdapter struct {
	fields map[string]any
	raw    map[string]string
	bad    string // the item is not an object: why
}

// fileItem is one l2.adapters element of the settings file.
type fileItem struct {
	line  int
	lines map[string]int
	rawAdapter
}

// fileAdapters reads the l2.adapters sequence node with positions.
func fileAdapters(seq *yamlv3.Node) []fileItem {
	var out []fileItem
	for _, it := range seq.Content {
		it = deref(it)
		fi := fileItem{line: it.Line, lines: map[string]int{}, rawAdapter: rawAdapter{raw: map[string]string{}}}
		if it.Kind != yamlv3.MappingNode || it.Decode(&fi.fields) != nil {
			fi.bad = "must be a mapping of adapter fields (type, …)"
		}
		for j := 0; fi.bad == "" && j+1 < len(it.Content); j += 2 {
			k, v := deref(it.Content[j]), deref(it.Content[j+1])
			fi.lines[k.Value] = k.Line
			if v.Kind == yamlv3.ScalarNode {
				fi.raw[k.Value] = v.Value
			}
		}
		out = append(out, fi)
	}
	return out
}

// rawAdapters turns a flag's or the env's value into raw adapters; a
// problem that concerns the whole value comes back as its reason.
func rawAdapters(v any) ([]rawAdapter, string) {
	var texts []string
	switch x := v.(type) {
	case nil:
		return nil, ""
	case []string: // repeated flag: one JSON object each
		texts = x
	case string: // env: a JSON array of objects; empty = none
		if strings.TrimSpace(x) == "" {
			return nil, ""
		}
		if len(x) > maxAdapters*maxAdapterText {
			return nil, fmt.Sprintf("is %d bytes; at most %d", len(x), maxAdapters*maxAdapterText)
		}
		var list []json.RawMessage
		if err := json.Unmarshal([]byte(x), &list); err != nil {
			return nil, `must be a JSON array of adapter objects, such as [{"type": "fs", "base_path": "/data/l2"}]`
		}
		for _, r := range list {
			texts = append(texts, string(r))
		}
	default:
		return nil, "must be a list of adapter objects"
	}
	if len(texts) > maxAdapters {
		return nil, fmt.Sprintf("%d adapters given; at most %d", len(texts), maxAdapters)
	}
	out := make([]rawAdapter, len(texts))
	for i, text := range texts {
		if len(text) > maxAdapterText {
			out[i].bad = fmt.Sprintf("is %d bytes; at most %d", len(text), maxAdapterText)
		} else if json.Unmarshal([]byte(text), &out[i].fields) != nil || out[i].fields == nil {
			out[i].bad = `must be a JSON object such as {"type": "fs", "base_path": "/data/l2"}`
		}
	}
	return out, ""
}

// fillCredentials gives every resp adapter without a username or password
// the one from the environment (kvdock's variable, else upstream's): the
// one place kvdock reads them.
func fillCredentials(adapters []Adapter, environ []string) {
	env := func(name string) string { v, _ := envLookup(environ, name); return v }
	user := cmp.Or(env(EnvRespUsername), env(EnvUpstreamRespUsername))
	pass := cmp.Or(env(EnvRespPassword), env(EnvUpstreamRespPassword))
	for i := range adapters {
		if r := &adapters[i].RESP; adapters[i].Type == "resp" {
			r.Username, r.Password = cmp.Or(r.Username, user), cmp.Or(r.Password, pass)
		}
	}
}

// jsonText is a value as JSON text (what problems and texts show).
func jsonText(v any) string {
	if b, err := json.Marshal(v); err == nil {
		return string(b)
	}
	return fmt.Sprint(v)
}

// fields are the adapter's set fields by name, type included: what a
// person would write.
func (a Adapter) fields() map[string]any {
	m := map[string]any{}
	if body, ok := a.body(); ok {
		b, _ := json.Marshal(body.Interface()) // strings, numbers, bools
		_ = json.Unmarshal(b, &m)
	}
	m["type"] = a.Type
	return m
}

// redactAdapters returns a copy of the list with every credential that is
// set replaced by Redacted.
func redactAdapters(list []Adapter) []Adapter {
	out := slices.Clone(list)
	for i := range out {
		for _, s := range []*string{&out[i].RESP.Username, &out[i].RESP.Password} {
			if *s != "" {
				*s = Redacted
			}
		}
	}
	return out
}

// adaptersText is the list as one JSON array ("[]" for none).
func adaptersText(list []Adapter) string {
	return "[" + strings.Join(adapterTexts(list), ", ") + "]"
}

// AdapterTexts lists the adapters, credentials redacted, in lookup order:
// what the faces show.
func AdapterTexts(c Config) []string { return adapterTexts(redactAdapters(c.L2.Adapters)) }

// adapterTexts are the adapters as a person writes them: one JSON object
// each, "type" first, then the fields that are set.
func adapterTexts(list []Adapter) []string {
	var out []string
	for _, a := range list {
		m := a.fields()
		parts := []string{`"type": ` + jsonText(a.Type)}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if k != "type" {
				parts = append(parts, jsonText(k)+": "+jsonText(m[k]))
			}
		}
		out = append(out, "{"+strings.Join(parts, ", ")+"}")
	}
	return out
}

// loadAdapters reads l2.adapters from the layer that set it (v as that
// layer gave it; items for the file), validates it and fills the
// credentials from environ.
func loadAdapters(v any, src Source, path string, items []fileItem, environ []string) ([]Adapter, []Problem) {
	var raw []rawAdapter
	reason := ""
	at := func(i int, _ string) Source {
		return Source{Kind: src.Kind, Detail: fmt.Sprintf("%s[%d]", src.Detail, i)}
	}
	if src.Kind != SourceFile {
		raw, reason = rawAdapters(v)
	} else {
		for _, it := range items {
			raw = append(raw, it.rawAdapter)
		}
		at = func(i int, field string) Source {
			line := items[i].line
			if l, ok := items[i].lines[field]; ok && field != "" {
				line = l
			}
			return Source{Kind: SourceFile, Detail: fmt.Sprintf("%s:%d", path, line)}
		}
	}
	if reason != "" {
		return nil, []Problem{{Key: KeyAdapters, Source: src, Reason: reason}}
	} else if len(raw) == 0 {
		return nil, nil
	}
	out, probs := checkAdapters(raw, at)
	if len(probs) == 0 {
		fillCredentials(out, environ)
	}
	return out, probs
}

// validateAdapters re-checks an adapter list already in a Config (a Config
// built in code), with src as the source of every problem.
func validateAdapters(list []Adapter, src Source) []Problem {
	raw := make([]rawAdapter, len(list))
	for i, a := range list {
		raw[i].fields = a.fields()
	}
	_, probs := checkAdapters(raw, func(int, string) Source { return src })
	return probs
}
