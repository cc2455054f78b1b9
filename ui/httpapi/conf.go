package httpapi

import (
	"encoding/json"
	"strconv"
	"strings"

	"kvdock/settings"
)

// ConfValue is one setting in /conf: its effective value (typed: numbers,
// booleans, strings, durations as Go duration text, null for an absent
// server.shm_name) and where it came from ("default", "flag --port",
// "env KVDOCK_L1_SIZE_GB", "file /etc/kvdock.yaml:3", "dashboard").
type ConfValue struct {
	Value  any    `json:"value"`
	Source string `json:"source"`
}

// Conf is /conf: group → leaf key → value and source.
type Conf map[string]map[string]ConfValue

// sourceText renders a settings.Source for /conf.
func sourceText(s settings.Source, ok bool) string {
	if !ok || s.Kind == settings.SourceDefault {
		return "default"
	}
	if s.Detail == "" {
		return s.Kind.String()
	}
	return s.Kind.String() + " " + s.Detail
}

// typedValue turns the editable text of a key into a JSON value of its kind.
func typedValue(kind, text string) any {
	switch kind {
	case "int", "int64":
		if n, err := strconv.ParseInt(text, 10, 64); err == nil {
			return n
		}
	case "float":
		if f, err := strconv.ParseFloat(text, 64); err == nil {
			return f
		}
	case "bool":
		if b, err := strconv.ParseBool(text); err == nil {
			return b
		}
	case "optional-string":
		if text == settings.AutoText {
			return nil
		}
	case "adapters":
		// Shown already redacted: a list of objects, as given.
		var list []any
		if err := json.Unmarshal([]byte(text), &list); err == nil && list != nil {
			return list
		}
		return []any{}
	}
	return text
}

// NewConf builds /conf from the running config and its sources. Secrets
// (the HTTP token, the L2 adapters' credentials) show as settings.Redacted
// when set.
func NewConf(cfg settings.Config, sources map[string]settings.Source) Conf {
	out := Conf{}
	for _, k := range settings.Keys() {
		text, err := settings.Shown(cfg, k.Key)
		if err != nil {
			continue
		}
		var v any = typedValue(k.Kind, text)
		group, leaf, _ := strings.Cut(k.Key, ".")
		if out[group] == nil {
			out[group] = map[string]ConfValue{}
		}
		src, ok := sources[k.Key]
		out[group][leaf] = ConfValue{Value: v, Source: sourceText(src, ok)}
	}
	return out
}
