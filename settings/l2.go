package settings

// The L2 tier settings: the typed adapter definitions the tier packages
// take, the adapter list as given (repeatable --l2-adapter JSON,
// KVDOCK_L2_ADAPTERS as a JSON array, l2.adapters in the file as a list of
// objects), their validation (every problem at once, with its source), the
// credentials read from the environment, and the redaction of those.

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
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
// FSL2AdapterConfig names): one file per chunk under BasePath. A zero field
// takes the tier's default. Upstream's read_ahead_size (a hint for network
// file systems) and use_odirect (needs block-aligned buffers and lengths,
// which values carrying a header are not) are refused with that reason.
type FSAdapter struct {
	BasePath string // base_path, required; created 0700 when missing
	// MaxCapacityGB (max_capacity_gb, GiB) is enforced by LRU eviction of
	// the tier's own files. Upstream's 0 = unbounded is refused: every
	// tier is bounded. 0 here = the tier's default.
	MaxCapacityGB float64
	// RelativeTmpDir (relative_tmp_dir) is a sub-directory of BasePath
	// where writes are staged before the rename into place; "" = the
	// chunk's own shard directory.
	RelativeTmpDir string
	// RecoverOnStart (recover_on_start, or upstream's older
	// scan_on_startup) rebuilds the index from a previous run's files; nil
	// = true. false starts cold and removes those files.
	RecoverOnStart *bool
}

// RESPAdapter is a {"type": "resp", …} tier (Redis or Valkey). A zero
// field takes the tier's default.
type RESPAdapter struct {
	Host          string   // host: one server; "" only with Cluster
	Port          int      // port; 0 = 6379
	Username      string   // username; missing = from the environment
	Password      string   // password (secret); missing = from the environment
	MaxCapacityGB float64  // max_capacity_gb: the budget of this process's own writes
	NumWorkers    int      // num_workers: calls in flight at once
	TLS           bool     // tls
	CAFile        string   // ca_file: PEM roots for TLS; "" = the system's
	Cluster       bool     // cluster
	StartupNodes  []string // startup_nodes: "host:port" seeds, with Cluster only
	KeyPrefix     *string  // key_prefix; nil = the tier's default
	TTLSeconds    int      // ttl_seconds; 0 = values never expire
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

// adapterField is one field an adapter type accepts.
type adapterField struct {
	name string
	// ptr points into the adapter: *string, **string, *int, *float64,
	// *bool, **bool or *[]string; nil for an upstream field kvdock refuses
	// (check gives the reason).
	ptr    func(a *Adapter) any
	check  func(v any) string // on a value that is set; "" when fine
	secret bool
	alias  string // the field this one is another name for
}

// adapterFields lists a type's fields (besides "type"), sorted by name.
func adapterFields(typ string) ([]adapterField, bool) {
	switch typ {
	case "fs":
		return []adapterField{
			{name: "base_path", ptr: func(a *Adapter) any { return &a.FS.BasePath }, check: func(v any) string {
				return cmpOr(nonEmpty(strings.TrimSpace(v.(string))), noNUL(v.(string)))
			}},
			{name: "max_capacity_gb", ptr: func(a *Adapter) any { return &a.FS.MaxCapacityGB }, check: func(v any) string {
				if v.(float64)*(1<<30) < 1<<20 && v.(float64) > 0 {
					return fmt.Sprintf("%v GiB is under 1 MiB", v)
				}
				return checkCapacity(v)
			}},
			{name: "read_ahead_size", check: func(any) string {
				return "not supported by kvdock's fs tier (a read-ahead hint for network file systems; each value is read with one request)"
			}},
			{name: "recover_on_start", ptr: func(a *Adapter) any { return &a.FS.RecoverOnStart }},
			{name: "relative_tmp_dir", ptr: func(a *Adapter) any { return &a.FS.RelativeTmpDir }, check: func(v any) string {
				d := v.(string)
				c := filepath.Clean(d)
				if d == "" || filepath.IsAbs(d) || c == "." || slices.Contains(strings.Split(c, "/"), "..") || noNUL(d) != "" {
					return "want a sub-directory of base_path (relative, no \"..\")"
				}
				return ""
			}},
			{name: "scan_on_startup", ptr: func(a *Adapter) any { return &a.FS.RecoverOnStart }, alias: "recover_on_start"},
			{name: "use_odirect", check: func(any) string {
				return "not supported by kvdock's fs tier (O_DIRECT needs block-aligned buffers and lengths)"
			}},
		}, true
	case "resp":
		nonEmptyText := func(v any) string { return nonEmpty(v.(string)) }
		return []adapterField{
			{name: "ca_file", ptr: func(a *Adapter) any { return &a.RESP.CAFile }, check: nonEmptyText},
			{name: "cluster", ptr: func(a *Adapter) any { return &a.RESP.Cluster }},
			{name: "host", ptr: func(a *Adapter) any { return &a.RESP.Host }, check: func(v any) string {
				if h := v.(string); h != "" && strings.ContainsAny(h, " /\t\r\n") {
					return "is not a host name or address"
				}
				return nonEmpty(v.(string))
			}},
			{name: "key_prefix", ptr: func(a *Adapter) any { return &a.RESP.KeyPrefix }},
			{name: "max_capacity_gb", ptr: func(a *Adapter) any { return &a.RESP.MaxCapacityGB }, check: checkCapacity},
			{name: "num_workers", ptr: func(a *Adapter) any { return &a.RESP.NumWorkers }, check: func(v any) string { return intRange(v.(int), 1, 1024) }},
			{name: "password", ptr: func(a *Adapter) any { return &a.RESP.Password }, secret: true},
			{name: "port", ptr: func(a *Adapter) any { return &a.RESP.Port }, check: func(v any) string { return intRange(v.(int), 1, 65535) }},
			{name: "startup_nodes", ptr: func(a *Adapter) any { return &a.RESP.StartupNodes }, check: checkNodes},
			{name: "tls", ptr: func(a *Adapter) any { return &a.RESP.TLS }},
			{name: "ttl_seconds", ptr: func(a *Adapter) any { return &a.RESP.TTLSeconds }, check: func(v any) string {
				return intRange(v.(int), 0, maxTTLSeconds)
			}},
			{name: "username", ptr: func(a *Adapter) any { return &a.RESP.Username }, secret: true},
		}, true
	}
	return nil, false
}

// adapterRules are the rules between an adapter's fields: [field, reason].
func adapterRules(a Adapter) [][2]string {
	var out [][2]string
	rule := func(broken bool, field, reason string) {
		if broken {
			out = append(out, [2]string{field, reason})
		}
	}
	switch r := a.RESP; a.Type {
	case "fs":
		rule(a.FS.BasePath == "", "base_path", `required for an "fs" adapter`)
	case "resp":
		rule(r.Cluster && len(r.StartupNodes) == 0, "startup_nodes", `required with "cluster": true (the seed nodes, "host:port" each)`)
		rule(r.Cluster && (r.Host != "" || r.Port != 0), "host", `not used with "cluster": true; list every seed node in startup_nodes`)
		rule(!r.Cluster && len(r.StartupNodes) > 0, "startup_nodes", `only used with "cluster": true; give host and port for one server`)
		rule(!r.Cluster && r.Host == "", "host", `required for a resp adapter (or "cluster": true with startup_nodes)`)
		rule(r.CAFile != "" && !r.TLS, "ca_file", `only used with "tls": true`)
	}
	return out
}

func cmpOr(reasons ...string) string {
	for _, r := range reasons {
		if r != "" {
			return r
		}
	}
	return ""
}

func noNUL(s string) string {
	if strings.IndexByte(s, 0) >= 0 {
		return "contains a NUL byte"
	}
	return ""
}

func checkCapacity(v any) string {
	if f := v.(float64); !(f > 0) || f > maxSizeGB {
		return fmt.Sprintf("must be > 0 and <= %d (GiB); upstream's 0 = unbounded is not supported: every tier is bounded", maxSizeGB)
	}
	return ""
}

func checkNodes(v any) string {
	nodes := v.([]string)
	if len(nodes) == 0 {
		return `must list at least one "host:port"`
	}
	if len(nodes) > maxStartupNodes {
		return fmt.Sprintf("must list at most %d nodes", maxStartupNodes)
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

// fieldValue is the value behind a field pointer and whether it is set
// (not the zero value that stands for the default).
func fieldValue(ptr any) (any, bool) {
	switch p := ptr.(type) {
	case **string:
		if *p == nil {
			return nil, false
		}
		return **p, true
	case **bool:
		if *p == nil {
			return nil, false
		}
		return **p, true
	case *[]string:
		return *p, *p != nil
	}
	v := reflect.ValueOf(ptr).Elem()
	return v.Interface(), !v.IsZero()
}

// setField stores a value as decoded from JSON or YAML (raw: a file
// scalar's text, which a string field takes as written: YAML would read
// 0123 as 83) into a field; the reason when its kind is wrong.
func setField(ptr any, v any, raw *string) string {
	switch p := ptr.(type) {
	case *string, **string:
		s, ok := v.(string)
		if raw != nil {
			s, ok = *raw, true
		}
		if !ok {
			return "must be a string"
		}
		if pp, isPtr := p.(**string); isPtr {
			*pp = &s
		} else {
			*p.(*string) = s
		}
	case *int:
		n, ok := toInt(v)
		if _, isText := v.(string); isText || !ok || n < math.MinInt32 || n > math.MaxInt32 {
			return "must be a whole number"
		}
		*p = int(n)
	case *float64:
		if _, isText := v.(string); isText {
			return "must be a number"
		}
		f, ok := toFloat(v)
		if !ok {
			return "must be a finite number"
		}
		*p = f
	case *bool, **bool:
		b, ok := v.(bool)
		if !ok {
			return "must be true or false"
		}
		if pp, isPtr := p.(**bool); isPtr {
			*pp = &b
		} else {
			*p.(*bool) = b
		}
	case *[]string:
		list, ok := v.([]any)
		out := make([]string, 0, len(list))
		for _, e := range list {
			s, isText := e.(string)
			ok = ok && isText
			out = append(out, s)
		}
		if !ok {
			return `must be a list of "host:port" strings`
		}
		*p = out
	}
	return ""
}

// fieldProblem is a problem of one adapter field ("" = the whole adapter).
type fieldProblem struct {
	field, reason string
	value         any // as given; nil when not about a value
	secret        bool
}

// checkAdapter checks a decoded adapter: each field that is present (given,
// or with present nil, set) and the rules between fields. One problem per
// field: the first found.
func checkAdapter(a Adapter, present map[string]bool, found []fieldProblem) []fieldProblem {
	fields, ok := adapterFields(a.Type)
	if !ok {
		return append(found, fieldProblem{field: "type", value: a.Type, reason: "accepted: " + adapterTypes})
	}
	for _, f := range fields {
		if f.ptr == nil || f.check == nil {
			continue
		}
		v, set := fieldValue(f.ptr(&a))
		if present != nil {
			set = present[f.name]
		}
		if reason := ""; set {
			if reason = f.check(v); reason != "" {
				found = append(found, fieldProblem{field: f.name, value: v, secret: f.secret, reason: reason})
			}
		}
	}
	for _, r := range adapterRules(a) {
		found = append(found, fieldProblem{field: r[0], reason: r[1]})
	}
	var out []fieldProblem
	seen := map[string]bool{}
	for _, p := range found {
		if !seen[p.field] {
			seen[p.field] = true
			out = append(out, p)
		}
	}
	return out
}

// decodeAdapter turns one adapter as given into its typed form, with the
// fields decoded and the problems of the fields that did not decode.
func decodeAdapter(r rawAdapter) (Adapter, map[string]bool, []fieldProblem) {
	typ, ok := r.fields["type"].(string)
	if !ok {
		return Adapter{}, nil, []fieldProblem{{field: "type", value: r.fields["type"], reason: "accepted: " + adapterTypes}}
	}
	a := Adapter{Type: typ}
	fields, known := adapterFields(typ)
	if !known {
		return a, nil, nil // checkAdapter names the type
	}
	given := map[string]bool{}
	var probs []fieldProblem
	names := make([]string, 0, len(r.fields))
	for name := range r.fields {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if name == "type" {
			continue
		}
		i := slices.IndexFunc(fields, func(f adapterField) bool { return f.name == name })
		if i < 0 {
			probs = append(probs, fieldProblem{field: name, reason: fmt.Sprintf("unknown field of a %q adapter; accepted: %s", typ, fieldList(fields))})
			continue
		}
		f, v := fields[i], r.fields[name]
		if f.ptr == nil {
			probs = append(probs, fieldProblem{field: name, value: v, reason: f.check(v)})
			continue
		}
		var raw *string
		if s, ok := r.raw[name]; ok {
			raw = &s
		}
		before, _ := fieldValue(f.ptr(&a))
		if reason := setField(f.ptr(&a), v, raw); reason != "" {
			probs = append(probs, fieldProblem{field: name, value: v, secret: f.secret, reason: reason})
			continue
		}
		if after, _ := fieldValue(f.ptr(&a)); f.alias != "" && given[f.alias] && before != after {
			probs = append(probs, fieldProblem{field: name, value: v, reason: "disagrees with " + f.alias + " (another name for it)"})
		}
		given[name] = true
		if f.alias != "" {
			given[f.alias] = true
		}
	}
	return a, given, probs
}

func fieldList(fields []adapterField) string {
	names := []string{"type"}
	for _, f := range fields {
		names = append(names, f.name)
	}
	return strings.Join(names, ", ")
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

// checkAdapters decodes and checks adapters as given (list) or already
// typed (typed, when list is nil) and returns the adapters without
// problems and every problem found, each with its source.
func checkAdapters(list []rawAdapter, typed []Adapter, at adapterSource) ([]Adapter, []Problem) {
	n := max(len(list), len(typed))
	if n > maxAdapters {
		return nil, []Problem{{Key: KeyAdapters, Source: at(0, ""), Reason: fmt.Sprintf("%d adapters given; at most %d", n, maxAdapters)}}
	}
	var out []Adapter
	var probs []Problem
	paths := map[string]int{}
	for i := range n {
		var a Adapter
		var present map[string]bool
		var found []fieldProblem
		if list == nil {
			a = typed[i]
		} else if list[i].bad != "" {
			found = []fieldProblem{{reason: list[i].bad}}
		} else {
			a, present, found = decodeAdapter(list[i])
		}
		if len(found) == 0 || found[0].field != "type" && found[0].field != "" {
			found = checkAdapter(a, present, found)
		}
		if p := a.FS.BasePath; a.Type == "fs" && p != "" {
			if first, dup := paths[p]; dup {
				found = append(found, fieldProblem{field: "base_path", value: p,
					reason: fmt.Sprintf("already used by %s[%d]; two tiers must not share a directory", KeyAdapters, first)})
			}
			paths[p] = i
		}
		for _, fp := range found {
			key := fmt.Sprintf("%s[%d]", KeyAdapters, i)
			if fp.field != "" {
				key += "." + fp.field
			}
			shown := ""
			if fp.value != nil {
				shown = adapterDisplay(fp.value)
			}
			if fp.secret && shown != "" {
				shown = Redacted
			}
			probs = append(probs, Problem{Key: key, Value: shown, Source: at(i, fp.field), Reason: fp.reason})
		}
		if len(found) == 0 {
			out = append(out, a)
		}
	}
	return out, probs
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
		fi := fileItem{line: it.Line, lines: map[string]int{}, rawAdapter: rawAdapter{raw: map[string]string{}, fields: map[string]any{}}}
		if it.Kind != yamlv3.MappingNode {
			fi.bad = "must be a mapping of adapter fields (type, …)"
			out = append(out, fi)
			continue
		}
		for j := 0; j+1 < len(it.Content); j += 2 {
			k, v := deref(it.Content[j]), deref(it.Content[j+1])
			fi.lines[k.Value] = k.Line
			switch v.Kind {
			case yamlv3.ScalarNode:
				fi.raw[k.Value] = v.Value
				var x any
				if err := v.Decode(&x); err != nil {
					x = v.Value
				}
				fi.fields[k.Value] = x
			case yamlv3.SequenceNode:
				var list []any
				for _, e := range v.Content {
					if e = deref(e); e.Kind != yamlv3.ScalarNode {
						list = append(list, map[string]any{})
						continue
					}
					list = append(list, e.Value)
				}
				fi.fields[k.Value] = list
			default:
				fi.fields[k.Value] = map[string]any{}
			}
		}
		out = append(out, fi)
	}
	return out
}

// parseAdapterJSON decodes one adapter object.
func parseAdapterJSON(text string) rawAdapter {
	if len(text) > maxAdapterText {
		return rawAdapter{bad: fmt.Sprintf("is %d bytes; at most %d", len(text), maxAdapterText)}
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(text), &m); err != nil || m == nil {
		return rawAdapter{bad: `must be a JSON object such as {"type": "fs", "base_path": "/data/l2"}`}
	}
	return rawAdapter{fields: m}
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
	for i, s := range texts {
		out[i] = parseAdapterJSON(s)
	}
	return out, ""
}

// fillCredentials gives every resp adapter without a username or password
// the one from the environment (kvdock's variable, else upstream's). This
// is the one place kvdock reads them.
func fillCredentials(adapters []Adapter, environ []string) {
	pick := func(names ...string) string {
		for _, n := range names {
			if v, ok := envLookup(environ, n); ok && v != "" {
				return v
			}
		}
		return ""
	}
	user := pick(EnvRespUsername, EnvUpstreamRespUsername)
	pass := pick(EnvRespPassword, EnvUpstreamRespPassword)
	for i := range adapters {
		if r := &adapters[i].RESP; adapters[i].Type == "resp" {
			r.Username = cmpOr(r.Username, user)
			r.Password = cmpOr(r.Password, pass)
		}
	}
}

// adapterDisplay shows a field value in a problem.
func adapterDisplay(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// fields are the adapter's set fields by name, type included: what a
// person would write, with credentials replaced by Redacted when redact.
func (a Adapter) fields(redact bool) map[string]any {
	m := map[string]any{"type": a.Type}
	fields, _ := adapterFields(a.Type)
	for _, f := range fields {
		if f.ptr == nil || f.alias != "" {
			continue
		}
		if v, set := fieldValue(f.ptr(&a)); set {
			if f.secret && redact {
				v = Redacted
			}
			m[f.name] = v
		}
	}
	return m
}

// redactAdapters returns a copy of the list with every credential that is
// set replaced by Redacted.
func redactAdapters(list []Adapter) []Adapter {
	out := slices.Clone(list)
	for i := range out {
		fields, _ := adapterFields(out[i].Type)
		for _, f := range fields {
			if p, ok := f.ptr(&out[i]).(*string); f.secret && ok && *p != "" {
				*p = Redacted
			}
		}
	}
	return out
}

// adaptersText is the list as one JSON array ("[]" for none).
func adaptersText(list []Adapter) string {
	maps := make([]map[string]any, len(list))
	for i, a := range list {
		maps[i] = a.fields(false)
	}
	b, err := json.Marshal(maps)
	if err != nil || len(list) == 0 {
		return "[]"
	}
	return string(b)
}

// AdapterTexts lists the adapters, credentials redacted, one JSON object
// each with "type" first, as a person writes it, in lookup order: what the
// faces show.
func AdapterTexts(c Config) []string {
	var out []string
	for _, a := range c.L2.Adapters {
		m := a.fields(true)
		names := slices.Sorted(maps.Keys(m))
		names = slices.Insert(slices.DeleteFunc(names, func(n string) bool { return n == "type" }), 0, "type")
		parts := make([]string, len(names))
		for i, k := range names {
			kb, _ := json.Marshal(k)
			vb, _ := json.Marshal(m[k]) // strings, numbers, bools, []string
			parts[i] = string(kb) + ": " + string(vb)
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
	var at adapterSource
	switch src.Kind {
	case SourceFile:
		for _, it := range items {
			raw = append(raw, it.rawAdapter)
		}
		at = func(i int, field string) Source {
			if i >= len(items) {
				return src
			}
			line := items[i].line
			if l, ok := items[i].lines[field]; ok && field != "" {
				line = l
			}
			return Source{Kind: SourceFile, Detail: fmt.Sprintf("%s:%d", path, line)}
		}
	default:
		list, reason := rawAdapters(v)
		if reason != "" {
			return nil, []Problem{{Key: KeyAdapters, Source: src, Reason: reason}}
		}
		raw = list
		at = func(i int, _ string) Source {
			return Source{Kind: src.Kind, Detail: fmt.Sprintf("%s[%d]", src.Detail, i)}
		}
	}
	if len(raw) == 0 {
		return nil, nil
	}
	out, probs := checkAdapters(raw, nil, at)
	if len(probs) > 0 {
		return out, probs
	}
	fillCredentials(out, environ)
	return out, nil
}

// validateAdapters re-checks an adapter list already in a Config (a Config
// built in code), with src as the source of every problem.
func validateAdapters(list []Adapter, src Source) []Problem {
	_, probs := checkAdapters(nil, list, func(int, string) Source { return src })
	return probs
}
