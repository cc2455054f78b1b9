package tier

import "encoding/json"

// Number reads a numeric adapter field as the decoders leave it: float64 or
// json.Number from JSON (flags, KVDOCK_L2_ADAPTERS), int from YAML, and the
// other integer kinds settings may canonicalise to. The backends' config
// parsers share it so both accept the same spellings.
func Number(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case float32:
		return float64(n), true
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	case uint64:
		return float64(n), true
	case json.Number:
		f, err := n.Float64()
		return f, err == nil
	}
	return 0, false
}
