package settings

// The L2 tier settings: the adapter list (repeatable --l2-adapter JSON,
// KVDOCK_L2_ADAPTERS as a JSON array, l2.adapters in the file as a list of
// objects), its field-level validation per adapter type, the credentials
// read from the environment, and the redaction of those credentials.

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
)

// L2Config is the L2 tiers behind the L1 pool.
type L2Config struct {
	// Adapters are the tiers in lookup order (the first is tried first).
	// After Load or a successful Validate each map holds only known fields of
	// its type, with canonical Go values: string, int, float64, bool and
	// []string (startup_nodes); resp credentials missing from a map are
	// filled from the environment at Load.
	Adapters []map[string]any `koanf:"adapters"`
	// StorePolicy is "write-behind" (published L1 chunks are queued for the
	// tiers) or "none" (tiers are only read).
	StorePolicy         string  `koanf:"store_policy"`
	PrefetchMaxInFlight int     `koanf:"prefetch_max_in_flight"`
	LoadTimeoutSeconds  float64 `koanf:"load_timeout_seconds"`
	// QueueBytes bounds the write-behind queue; past it writes are dropped.
	QueueBytes int64 `koanf:"queue_bytes"`
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

// maxAdapters bounds the tier list: every tier is a lookup step.
const maxAdapters = 16

// maxAdapterText bounds one adapter's text (a flag's JSON) and the whole
// list's (the env's JSON array).
const maxAdapterText = 64 << 10

// maxStartupNodes bounds a cluster's seed list.
const maxStartupNodes = 64

// The kinds an adapter field may have.
const (
	fString = iota
	fInt
	fFloat
	fBool
	fStrings
)

// adapterField describes one field an adapter type accepts.
type adapterField struct {
	kind     int
	secret   bool
	required bool
	check    func(v any) string // on the canonical value; "" when fine
}

// adapterFields lists, per type, the fields accepted. The backends parse the
// maps Load leaves; a field they read must be listed here.
func adapterFields(typ string) (map[string]adapterField, bool) {
	capacity := adapterField{kind: fFloat, check: func(v any) string {
		if f := v.(float64); !(f > 0) || f > maxSizeGB {
			return fmt.Sprintf("must be > 0 and <= %d (GiB)", maxSizeGB)
		}
		return ""
	}}
	switch typ {
	case "fs":
		return map[string]adapterField{
			"type": {kind: fString},
			"base_path": {kind: fString, required: true, check: func(v any) string {
				return nonEmpty(v.(string))
			}},
			"max_capacity_gb": capacity,
			"relative_tmp_dir": {kind: fString, check: func(v any) string {
				d := v.(string)
				if d == "" || strings.HasPrefix(d, "/") || slices.Contains(strings.Split(d, "/"), "..") {
					return "want a sub-directory of base_path (relative, no \"..\")"
				}
				return ""
			}},
			"recover_on_start": {kind: fBool},
			"scan_on_startup":  {kind: fBool}, // upstream's older name for recover_on_start
			// Upstream fields kvdock's fs tier refuses, with the reason.
			"read_ahead_size": {kind: fInt, check: func(any) string {
				return "not supported by kvdock's fs tier (a read-ahead hint for network file systems; each value is read with one request)"
			}},
			"use_odirect": {kind: fBool, check: func(any) string {
				return "not supported by kvdock's fs tier (O_DIRECT needs block-aligned buffers and lengths)"
			}},
		}, true
	case "resp":
		return map[string]adapterField{
			"type":            {kind: fString},
			"host":            {kind: fString, check: func(v any) string { return nonEmpty(v.(string)) }},
			"port":            {kind: fInt, check: func(v any) string { return intRange(v.(int), 1, 65535) }},
			"username":        {kind: fString, secret: true},
			"password":        {kind: fString, secret: true},
			"max_capacity_gb": capacity,
			"num_workers":     {kind: fInt, check: func(v any) string { return intRange(v.(int), 1, 1024) }},
			"tls":             {kind: fBool},
			"ca_file":         {kind: fString, check: func(v any) string { return nonEmpty(v.(string)) }},
			"cluster":         {kind: fBool},
			"startup_nodes":   {kind: fStrings, check: checkNodes},
			"key_prefix":      {kind: fString},
			"ttl_seconds":     {kind: fInt, check: func(v any) string { return intRange(v.(int), 0, math.MaxInt32) }},
		}, true
	}
	return nil, false
}

// adapterTypes lists the accepted types.
const adapterTypes = `"fs", "resp"`

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

// adapterSource says where adapter i came from, and the line of a field
// when the file gave it.
type adapterSource func(i int, field string) Source

// rawAdapter is one adapter as given, before validation: field → value
// (strings, float64/int numbers, bools, []any), plus, for a file, the raw
// text and line of each field.
type rawAdapter struct {
	fields map[string]any
	raw    map[string]string // file only: scalar text as written
	bad    string            // the item is not an object: why
}

// fileItem is one l2.adapters element of the settings file.
type fileItem struct {
	line   int
	lines  map[string]int
	raw    map[string]string
	fields map[string]any
	bad    string
}

// fileAdapters reads the l2.adapters sequence node with positions.
func fileAdapters(seq *yamlv3.Node) []fileItem {
	var out []fileItem
	for _, it := range seq.Content {
		it = deref(it)
		fi := fileItem{line: it.Line, lines: map[string]int{}, raw: map[string]string{}, fields: map[string]any{}}
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
					e = deref(e)
					if e.Kind != yamlv3.ScalarNode {
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
func parseAdapterJSON(text string) (map[string]any, string) {
	if len(text) > maxAdapterText {
		return nil, fmt.Sprintf("is %d bytes; at most %d", len(text), maxAdapterText)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(text), &m); err != nil || m == nil {
		return nil, `must be a JSON object such as {"type": "fs", "base_path": "/data/l2"}`
	}
	return m, ""
}

// rawAdapters turns a flag's, the env's or Set's value into raw adapters;
// a problem that concerns the whole value comes back as its reason.
func rawAdapters(v any) ([]rawAdapter, []string, string) {
	switch x := v.(type) {
	case nil:
		return nil, nil, ""
	case []string: // repeated flag: one JSON object each
		if len(x) > maxAdapters {
			return nil, nil, fmt.Sprintf("%d adapters given; at most %d", len(x), maxAdapters)
		}
		out := make([]rawAdapter, len(x))
		reasons := make([]string, len(x))
		for i, s := range x {
			m, reason := parseAdapterJSON(s)
			out[i] = rawAdapter{fields: m, bad: reason}
			reasons[i] = reason
		}
		return out, reasons, ""
	case string: // env or Set: a JSON array of objects; empty = none
		if strings.TrimSpace(x) == "" {
			return nil, nil, ""
		}
		if len(x) > maxAdapters*maxAdapterText {
			return nil, nil, fmt.Sprintf("is %d bytes; at most %d", len(x), maxAdapters*maxAdapterText)
		}
		var list []json.RawMessage
		if err := json.Unmarshal([]byte(x), &list); err != nil {
			return nil, nil, `must be a JSON array of adapter objects, such as [{"type": "fs", "base_path": "/data/l2"}]`
		}
		if len(list) > maxAdapters {
			return nil, nil, fmt.Sprintf("%d adapters given; at most %d", len(list), maxAdapters)
		}
		out := make([]rawAdapter, len(list))
		for i, r := range list {
			m, reason := parseAdapterJSON(string(r))
			out[i] = rawAdapter{fields: m, bad: reason}
		}
		return out, nil, ""
	}
	return nil, nil, "must be a list of adapter objects"
}

// checkAdapters validates raw adapters one field at a time and returns the
// canonical maps (nil where an adapter is wrong) with every problem found.
func checkAdapters(list []rawAdapter, at adapterSource) ([]map[string]any, []Problem) {
	var probs []Problem
	if len(list) > maxAdapters {
		return nil, []Problem{{Key: KeyAdapters, Source: at(0, ""),
			Reason: fmt.Sprintf("%d adapters given; at most %d", len(list), maxAdapters)}}
	}
	out := make([]map[string]any, 0, len(list))
	paths := map[string]int{}
	for i, a := range list {
		key := fmt.Sprintf("%s[%d]", KeyAdapters, i)
		bad := func(field string, value any, secret bool, reason string) {
			k := key
			if field != "" {
				k += "." + field
			}
			shown := ""
			if value != nil {
				shown = adapterDisplay(value)
				if secret {
					shown = Redacted
				}
			}
			probs = append(probs, Problem{Key: k, Value: shown, Source: at(i, field), Reason: reason})
		}
		if a.bad != "" {
			bad("", nil, false, a.bad)
			continue
		}
		typ, ok := a.fields["type"].(string)
		fields, known := adapterFields(typ)
		if !ok || !known {
			bad("type", a.fields["type"], false, "accepted: "+adapterTypes)
			continue
		}
		canon := map[string]any{}
		names := make([]string, 0, len(a.fields))
		for name := range a.fields {
			names = append(names, name)
		}
		sort.Strings(names)
		fine := true
		for _, name := range names {
			f, ok := fields[name]
			if !ok {
				bad(name, nil, false, fmt.Sprintf("unknown field of a %q adapter; accepted: %s", typ, fieldList(fields)))
				fine = false
				continue
			}
			raw, fromFile := a.raw[name]
			v, reason := canonical(f.kind, a.fields[name], raw, fromFile)
			if reason == "" && f.check != nil {
				reason = f.check(v)
			}
			if reason != "" {
				bad(name, a.fields[name], f.secret, reason)
				fine = false
				continue
			}
			canon[name] = v
		}
		for _, name := range sortedKeys(fields) {
			if _, given := a.fields[name]; fields[name].required && !given {
				bad(name, nil, false, fmt.Sprintf("required for a %q adapter", typ))
				fine = false
			}
		}
		if typ == "resp" {
			for _, r := range respRules(a.fields, canon) {
				bad(r[0], nil, false, r[1])
				fine = false
			}
		}
		if typ == "fs" {
			if p, ok := canon["base_path"].(string); ok {
				if first, dup := paths[p]; dup {
					bad("base_path", p, false, fmt.Sprintf("already used by %s[%d]; two tiers must not share a directory", KeyAdapters, first))
					fine = false
				}
				paths[p] = i
			}
		}
		if fine {
			out = append(out, canon)
		}
	}
	return out, probs
}

// respRules are the rules between resp fields: [field, reason] pairs.
// given holds the fields as given (presence), c their checked values.
func respRules(given, c map[string]any) [][2]string {
	var out [][2]string
	cluster, _ := c["cluster"].(bool)
	_, hasNodes := given["startup_nodes"]
	_, hasHost := given["host"]
	_, hasPort := given["port"]
	switch {
	case cluster && !hasNodes:
		out = append(out, [2]string{"startup_nodes", `required with "cluster": true (the seed nodes, "host:port" each)`})
	case cluster && (hasHost || hasPort):
		out = append(out, [2]string{"host", `not used with "cluster": true; list every seed node in startup_nodes`})
	case !cluster && hasNodes:
		out = append(out, [2]string{"startup_nodes", `only used with "cluster": true; give host and port for one server`})
	case !cluster && !hasHost:
		out = append(out, [2]string{"host", `required for a resp adapter (or "cluster": true with startup_nodes)`})
	}
	if _, ca := given["ca_file"]; ca {
		if tls, _ := c["tls"].(bool); !tls {
			out = append(out, [2]string{"ca_file", `only used with "tls": true`})
		}
	}
	return out
}

// fillCredentials gives every resp adapter without a username or password
// the one from the environment (kvdock's variable, else upstream's).
func fillCredentials(adapters []map[string]any, environ []string) {
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
	for _, a := range adapters {
		if a["type"] != "resp" {
			continue
		}
		if s, _ := a["username"].(string); s == "" && user != "" {
			a["username"] = user
		}
		if s, _ := a["password"].(string); s == "" && pass != "" {
			a["password"] = pass
		}
	}
}

// canonical converts a given value to a field's kind. From a file, a
// string field takes the text as written (YAML would read 0123 as 83).
func canonical(kind int, v any, raw string, fromFile bool) (any, string) {
	switch kind {
	case fString:
		if fromFile {
			if _, isScalar := v.(map[string]any); !isScalar {
				if _, isList := v.([]any); !isList {
					return raw, ""
				}
			}
		}
		if s, ok := v.(string); ok {
			return s, ""
		}
		return nil, "must be a string"
	case fInt:
		if _, isText := v.(string); isText {
			return nil, "must be a whole number"
		}
		n, ok := toInt(v)
		if !ok || n < math.MinInt32 || n > math.MaxInt32 {
			return nil, "must be a whole number"
		}
		return int(n), ""
	case fFloat:
		if _, isText := v.(string); isText {
			return nil, "must be a number"
		}
		f, ok := toFloat(v)
		if !ok {
			return nil, "must be a finite number"
		}
		return f, ""
	case fBool:
		if b, ok := v.(bool); ok {
			return b, ""
		}
		return nil, "must be true or false"
	case fStrings:
		list, ok := v.([]any)
		if !ok {
			return nil, `must be a list of "host:port" strings`
		}
		out := make([]string, 0, len(list))
		for _, e := range list {
			s, ok := e.(string)
			if !ok {
				return nil, `must be a list of "host:port" strings`
			}
			out = append(out, s)
		}
		return out, ""
	}
	return nil, "unsupported field kind"
}

func fieldList(fields map[string]adapterField) string {
	return strings.Join(sortedKeys(fields), ", ")
}

func sortedKeys(fields map[string]adapterField) []string {
	out := make([]string, 0, len(fields))
	for k := range fields {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// adapterDisplay shows a given field value in a problem.
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

// isSecretField says whether an adapter field holds a credential.
func isSecretField(typ, name string) bool {
	fields, ok := adapterFields(typ)
	return ok && fields[name].secret
}

// redactAdapters returns a copy of the list with every credential that is
// set replaced by Redacted.
func redactAdapters(list []map[string]any) []map[string]any {
	if list == nil {
		return nil
	}
	out := make([]map[string]any, len(list))
	for i, a := range list {
		typ, _ := a["type"].(string)
		c := make(map[string]any, len(a))
		for k, v := range a {
			if s, isStr := v.(string); isSecretField(typ, k) || k == "password" || k == "username" {
				if !isStr || s != "" {
					v = Redacted
				}
			}
			c[k] = v
		}
		out[i] = c
	}
	return out
}

// adaptersText is the list as one JSON array ("[]" for none).
func adaptersText(list []map[string]any) string {
	if len(list) == 0 {
		return "[]"
	}
	b, err := json.Marshal(list)
	if err != nil {
		return "[]"
	}
	return string(b)
}

// adapterText is one adapter as a JSON object, type first, as a person
// writes it.
func adapterText(a map[string]any) string {
	var b strings.Builder
	b.WriteByte('{')
	names := make([]string, 0, len(a))
	for k := range a {
		if k != "type" {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	if _, ok := a["type"]; ok {
		names = append([]string{"type"}, names...)
	}
	for i, k := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		kb, _ := json.Marshal(k)
		vb, err := json.Marshal(a[k])
		if err != nil {
			vb = []byte("null")
		}
		b.Write(kb)
		b.WriteString(": ")
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.String()
}

// AdapterTexts lists the adapters, credentials redacted, one JSON object
// each, in lookup order: what the faces show.
func AdapterTexts(c Config) []string {
	var out []string
	for _, a := range redactAdapters(c.L2.Adapters) {
		out = append(out, adapterText(a))
	}
	return out
}

// loadAdapters reads l2.adapters from the layer that set it (v as that
// layer gave it; items for the file), validates it field by field and
// fills the credentials from environ.
func loadAdapters(v any, src Source, path string, items []fileItem, environ []string) ([]map[string]any, []Problem) {
	var raw []rawAdapter
	var at adapterSource
	switch src.Kind {
	case SourceFile:
		for _, it := range items {
			raw = append(raw, rawAdapter{fields: it.fields, raw: it.raw, bad: it.bad})
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
		list, _, reason := rawAdapters(v)
		if reason != "" {
			return nil, []Problem{{Key: KeyAdapters, Source: src, Reason: reason}}
		}
		raw = list
		at = func(i int, _ string) Source {
			return Source{Kind: src.Kind, Detail: fmt.Sprintf("%s[%d]", src.Detail, i)}
		}
	}
	out, probs := checkAdapters(raw, at)
	if len(probs) > 0 {
		return out, probs
	}
	fillCredentials(out, environ)
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// validateAdapters re-checks an adapter list already in a Config (after
// Set, or a Config built in code), with src as the source of every problem.
func validateAdapters(list []map[string]any, src Source) []Problem {
	raw := make([]rawAdapter, len(list))
	for i, a := range list {
		fields := make(map[string]any, len(a))
		for k, v := range a {
			if ss, ok := v.([]string); ok {
				l := make([]any, len(ss))
				for j, s := range ss {
					l[j] = s
				}
				v = l
			}
			fields[k] = v
		}
		raw[i] = rawAdapter{fields: fields}
	}
	_, probs := checkAdapters(raw, func(int, string) Source { return src })
	return probs
}
