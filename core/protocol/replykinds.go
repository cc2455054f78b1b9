package protocol

import (
	"fmt"
	"strconv"
)

// What a reply of each table's client decodes, as the upstream clients of
// the frames eras do it (spec sections 1.2 and 2.1): a reply without a
// result frame resolves any request to None; int and bool results are
// decoded untyped and passed to int() or bool(); every other result is
// decoded as its declared type, and a mismatch raises in the client's
// shared polling thread, which then stops answering every request of
// that client. The newest era (framing: message) decodes the reply struct
// of the request it sent and nothing else.
//
// Protocol auto-detection uses these to answer a message whose table is
// not known yet only with a reply every candidate reading's client decodes.

// ResultIntDigits is the result type of a GET_CHUNK_SIZE answered as a
// decimal string ("256"): int("256") reads it and a client expecting a str
// decodes it. Auto-detection uses it where one reading of an ambiguous
// message is GET_CHUNK_SIZE and another one a str result (NOOP); profile
// tables do not.
const ResultIntDigits = "int_as_str"

// Sent reply kinds (ReplySent) besides the Result* names.
const (
	SentNone   = "no_frame"   // no result frame
	SentDigits = "int_as_str" // a decimal string carrying an int
)

// ReplySent is the kind of reply p sends for spec: SentNone, SentDigits, a
// Result* name, or "message:" and the request name for a reply struct.
func ReplySent(p *Profile, spec *Spec) string {
	if p.Message() {
		return "message:" + spec.Name
	}
	switch spec.Result {
	case ResultNone:
		return SentNone
	case ResultOptInt:
		return ResultInt
	case ResultIntDigits:
		return SentDigits
	}
	return spec.Result
}

// ReplyDecodes reports whether p's client, having sent spec's request,
// decodes a reply of kind sent (see ReplySent) without raising.
func ReplyDecodes(p *Profile, spec *Spec, sent string) bool {
	if p.Message() {
		return sent == "message:"+spec.Name
	}
	if sent == SentNone {
		return true
	}
	switch spec.Result {
	case ResultNone:
		return false
	case ResultInt, ResultOptInt:
		// int(True) decodes, but as 1: a count or a chunk size must be
		// the number itself.
		return sent == ResultInt || sent == SentDigits
	case ResultBool:
		return sent == ResultInt || sent == ResultBool || sent == ResultStr || sent == SentDigits
	case ResultStr:
		return sent == ResultStr || sent == SentDigits
	}
	return sent == spec.Result
}

// digits is an integer result as a decimal string (ResultIntDigits).
func digits(res any) (string, error) {
	switch v := res.(type) {
	case int64:
		return strconv.FormatInt(v, 10), nil
	case int:
		return strconv.Itoa(v), nil
	}
	return "", fmt.Errorf("result %T is not an integer", res)
}
