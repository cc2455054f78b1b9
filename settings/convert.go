package settings

// The conversions between a Config field (held as a pointer in the key table)
// and the values that reach it: YAML scalars, environment and flag text, and
// the text the dashboard editor and Get/Set exchange.

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// kindOf names the type behind a field pointer.
func kindOf(ptr any) string {
	switch ptr.(type) {
	case *string:
		return "string"
	case *int:
		return "int"
	case *int64:
		return "int64"
	case *float64:
		return "float"
	case *bool:
		return "bool"
	case *time.Duration:
		return "duration"
	case **string:
		return "optional-string"
	case *[]Adapter:
		return "adapters"
	}
	return "unknown"
}

// text is the editable form of a field: Set(text(x)) gives x back.
func text(ptr any) string {
	switch p := ptr.(type) {
	case *string:
		return *p
	case *int:
		return strconv.Itoa(*p)
	case *int64:
		return strconv.FormatInt(*p, 10)
	case *float64:
		return strconv.FormatFloat(*p, 'g', -1, 64)
	case *bool:
		return strconv.FormatBool(*p)
	case *time.Duration:
		return p.String()
	case **string:
		if *p == nil {
			return AutoText
		}
		return **p
	case *[]Adapter:
		return adaptersText(*p)
	}
	return ""
}

// display is text with strings quoted, for messages and diffs.
func display(ptr any) string {
	switch p := ptr.(type) {
	case *string:
		return strconv.Quote(*p)
	case **string:
		if *p == nil {
			return "auto"
		}
		return strconv.Quote(**p)
	}
	return text(ptr)
}

// rawDisplay shows an input value that could not be decoded.
func rawDisplay(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

// assign stores v (from YAML, env, a flag or Set) into the field. It returns
// what is accepted when v does not fit.
func assign(ptr any, v any) string {
	switch p := ptr.(type) {
	case *string:
		s, ok := scalarString(v)
		if !ok {
			return "must be a string"
		}
		*p = s
	case **string:
		if v == nil {
			*p = nil
			return ""
		}
		s, ok := scalarString(v)
		if !ok {
			return "must be a string"
		}
		*p = &s
	case *int:
		n, ok := toInt(v)
		if !ok || n < math.MinInt || n > math.MaxInt {
			return "must be an integer"
		}
		*p = int(n)
	case *int64:
		n, ok := toInt(v)
		if !ok {
			return "must be an integer"
		}
		*p = n
	case *float64:
		f, ok := toFloat(v)
		if !ok {
			return "must be a finite number"
		}
		*p = f
	case *bool:
		switch b := v.(type) {
		case bool:
			*p = b
		case string:
			parsed, err := strconv.ParseBool(strings.TrimSpace(b))
			if err != nil {
				return "must be true or false"
			}
			*p = parsed
		default:
			return "must be true or false"
		}
	case *time.Duration:
		switch d := v.(type) {
		case time.Duration:
			*p = d
		case string:
			parsed, err := time.ParseDuration(strings.TrimSpace(d))
			if err != nil {
				return "must be a duration with a unit, such as 500ms or 2s"
			}
			*p = parsed
		default:
			return "must be a duration with a unit, such as 500ms or 2s"
		}
	case *[]Adapter:
		list, reason := rawAdapters(v)
		if reason != "" {
			return reason
		}
		out, probs := checkAdapters(list, func(int, string) Source { return Source{} })
		if len(probs) > 0 {
			return probs[0].Key + ": " + probs[0].Reason
		}
		*p = out
	default:
		return "unsupported field type"
	}
	return ""
}

// scalarString accepts strings and, for YAML's sake, other scalars written
// without quotes (token: 12345).
func scalarString(v any) (string, bool) {
	switch s := v.(type) {
	case string:
		return s, true
	case int, int64, uint64, bool:
		return fmt.Sprint(s), true
	case float64:
		return strconv.FormatFloat(s, 'g', -1, 64), true
	}
	return "", false
}

// toInt accepts integers of any decoded type, whole floats and decimal text.
func toInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int64:
		return n, true
	case uint64:
		if n > math.MaxInt64 {
			return 0, false
		}
		return int64(n), true
	case float64:
		if n != math.Trunc(n) || n < math.MinInt64 || n >= math.MaxInt64 {
			return 0, false
		}
		return int64(n), true
	case string:
		parsed, err := strconv.ParseInt(strings.TrimSpace(n), 10, 64)
		return parsed, err == nil
	}
	return 0, false
}

// toFloat accepts numbers of any decoded type and decimal text; NaN and the
// infinities are refused.
func toFloat(v any) (float64, bool) {
	var f float64
	switch n := v.(type) {
	case float64:
		f = n
	case int:
		f = float64(n)
	case int64:
		f = float64(n)
	case uint64:
		f = float64(n)
	case string:
		parsed, err := strconv.ParseFloat(strings.TrimSpace(n), 64)
		if err != nil {
			return 0, false
		}
		f = parsed
	default:
		return 0, false
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}
