// Package protocol is the LMCache MP wire vocabulary: the payload and result
// types, their msgpack encoding as msgspec writes it (maps keyed by field name,
// every field present, declaration order; tolerant decoding), and protocol
// profiles, the per-release tables mapping request numbers to names, payload
// types, scheduling classes and canonical handlers.
//
// Profiles are data (YAML); this package parses bytes handed to it and knows
// nothing of where they are stored.
package protocol

import (
	"errors"
	"fmt"
	"slices"

	"go.yaml.in/yaml/v3"
)

// Canonical request names: handlers are registered under these, whatever name
// or number a profile gives the request on the wire.
const (
	RegisterKVCache                = "REGISTER_KV_CACHE"
	UnregisterKVCache              = "UNREGISTER_KV_CACHE"
	Store                          = "STORE"
	Retrieve                       = "RETRIEVE"
	Lookup                         = "LOOKUP"
	QueryPrefetchStatus            = "QUERY_PREFETCH_STATUS"
	WaitPrefetchStatus             = "WAIT_PREFETCH_STATUS"
	QueryPrefetchLookupHits        = "QUERY_PREFETCH_LOOKUP_HITS"
	FreeLookupLocks                = "FREE_LOOKUP_LOCKS"
	EndSession                     = "END_SESSION"
	RegisterKVCacheNonGPUContext   = "REGISTER_KV_CACHE_NON_GPU_CONTEXT"
	UnregisterKVCacheNonGPUContext = "UNREGISTER_KV_CACHE_NON_GPU_CONTEXT"
	PrepareStore                   = "PREPARE_STORE"
	CommitStore                    = "COMMIT_STORE"
	CommitStoreGroup               = "COMMIT_STORE_GROUP"
	PrepareRetrieve                = "PREPARE_RETRIEVE"
	CommitRetrieve                 = "COMMIT_RETRIEVE"
	Clear                          = "CLEAR"
	GetChunkSize                   = "GET_CHUNK_SIZE"
	Ping                           = "PING"
	ReportBlockAllocation          = "REPORT_BLOCK_ALLOCATION"
	Noop                           = "NOOP"
	GetExperimental                = "GET_EXPERIMENTAL"
	PollKVEvents                   = "POLL_KV_EVENTS"
)

// CanonicalNames lists every canonical handler name.
func CanonicalNames() []string {
	return []string{RegisterKVCache, UnregisterKVCache, Store, Retrieve, Lookup,
		QueryPrefetchStatus, WaitPrefetchStatus, QueryPrefetchLookupHits, FreeLookupLocks, EndSession,
		RegisterKVCacheNonGPUContext, UnregisterKVCacheNonGPUContext, PrepareStore,
		CommitStore, CommitStoreGroup, PrepareRetrieve, CommitRetrieve, Clear,
		GetChunkSize, Ping, ReportBlockAllocation, Noop, GetExperimental, PollKVEvents}
}

// Class is where a request runs (spec 1.5).
type Class string

const (
	// Inline runs on the socket goroutine; its reply leaves before the next read.
	Inline Class = "inline"
	// Ordered runs on the FIFO worker chosen by the peer identity, so one peer's
	// ordered requests run serially in arrival order (prepare → commit).
	Ordered Class = "ordered"
	// Shared runs on any worker of the shared pool, in any order.
	Shared Class = "shared"
)

// Spec is one request of a profile.
type Spec struct {
	// Name is the wire name in this profile (RequestType member name).
	Name   string `yaml:"name"`
	Number int64  `yaml:"number"`
	// Payload lists the payload frame types in order (see the Type* constants).
	Payload []string `yaml:"payload"`
	// Alternatives are other accepted payload shapes, told apart by frame count;
	// the handler sees the args of whichever shape matched (len(Args) tells).
	Alternatives [][]string `yaml:"alternatives"`
	Result       string     `yaml:"result"`
	Class        Class      `yaml:"class"`
	// Handler is the canonical name the request is dispatched to.
	Handler string `yaml:"handler"`
	// Unsupported, when set, is the bad-input kind the request is counted under
	// instead of being decoded and dispatched (e.g. "cuda_unsupported").
	Unsupported string `yaml:"unsupported"`
	// Fields (framing: message) names the request struct's field holding
	// each Payload type, in order; empty with one Payload type means the
	// struct is that type itself (registration).
	Fields []string `yaml:"fields"`
	// Optional (framing: message) counts the trailing Fields that may be
	// missing (upstream gives them defaults; the handler sees fewer args).
	Optional int `yaml:"optional"`
	// Reply (framing: message) names the one field of the reply struct that
	// carries a scalar result.
	Reply []string `yaml:"reply"`
	// Profile is the name of the profile the request belongs to (set by Parse).
	Profile string `yaml:"-"`
}

// Shapes returns Payload followed by the Alternatives.
func (s *Spec) Shapes() [][]string {
	return append([][]string{s.Payload}, s.Alternatives...)
}

// Profile is one protocol table.
type Profile struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// ErrorMarker enables mid-era LMCACHE_RPC_ERROR_V1 error replies; when false
	// errors are never answered (seed clients die on an unexpected frame).
	ErrorMarker bool `yaml:"error_marker"`
	// Framing is FramingFrames (default) or FramingMessage.
	Framing  string `yaml:"framing"`
	Requests []Spec `yaml:"requests"`

	byNumber map[int64]*Spec
	byName   map[string]*Spec
}

// Load reads the table of the named profile through read (assets.Protocol
// for the embedded ones) and parses it.
func Load(name string, read func(name string) ([]byte, error)) (*Profile, error) {
	data, err := read(name)
	if err != nil {
		return nil, err
	}
	p, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("protocol profile %s: %w", name, err)
	}
	return p, nil
}

// Parse reads and validates a profile table; every problem is reported.
func Parse(data []byte) (*Profile, error) {
	var p Profile
	if err := yaml.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("protocol profile: %w", err)
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if p.Name == "" {
		bad("profile has no name")
	}
	if len(p.Requests) == 0 {
		bad("profile %q has no requests", p.Name)
	}
	switch p.Framing {
	case "":
		p.Framing = FramingFrames
	case FramingFrames, FramingMessage:
	default:
		bad("framing %q, want frames or message", p.Framing)
	}
	canon := CanonicalNames()
	p.byNumber = make(map[int64]*Spec, len(p.Requests))
	p.byName = make(map[string]*Spec, len(p.Requests))
	for i := range p.Requests {
		s := &p.Requests[i]
		where := fmt.Sprintf("request %d (%s)", i, s.Name)
		s.Profile = p.Name
		if s.Name == "" {
			bad("%s: no name", where)
		}
		if s.Number <= 0 {
			bad("%s: number %d, want > 0", where, s.Number)
		}
		if o, dup := p.byNumber[s.Number]; dup {
			bad("%s: number %d already used by %s", where, s.Number, o.Name)
		}
		if _, dup := p.byName[s.Name]; dup {
			bad("%s: name used twice", where)
		}
		p.byNumber[s.Number], p.byName[s.Name] = s, s
		if !slices.Contains(canon, s.Handler) {
			bad("%s: handler %q is not a canonical request name", where, s.Handler)
		}
		switch s.Class {
		case Inline, Ordered, Shared:
		default:
			bad("%s: class %q, want inline, ordered or shared", where, s.Class)
		}
		if s.Result == "" {
			s.Result = ResultNone
		}
		if !knownResultType(s.Result) {
			bad("%s: unknown result type %q", where, s.Result)
		}
		validateMessageSpec(s, p.Framing == FramingMessage, bad, where)
		arities := map[int]bool{}
		for _, shape := range s.Shapes() {
			if arities[len(shape)] {
				bad("%s: two payload shapes with %d frames", where, len(shape))
			}
			arities[len(shape)] = true
			for _, t := range shape {
				if !knownPayloadType(t) {
					bad("%s: unknown payload type %q", where, t)
				}
			}
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("protocol profile %q: %w", p.Name, errors.Join(errs...))
	}
	return &p, nil
}

// PingCarriesID reports whether the profile's PING takes an instance id
// ([instance_id | None], the engine-driven era on): only then can a worker
// prove it is alive, and only then may the liveness reaper run.
func (p *Profile) PingCarriesID() bool {
	s, ok := p.ByName(Ping)
	if !ok {
		return false
	}
	for _, shape := range s.Shapes() {
		if len(shape) == 1 && shape[0] == TypeOptInt {
			return true
		}
	}
	return false
}

// ByNumber returns the request with the given wire number.
func (p *Profile) ByNumber(n int64) (*Spec, bool) {
	s, ok := p.byNumber[n]
	return s, ok
}

// ByName returns the request with the given wire name, or, failing that, the
// first request whose canonical handler is name.
func (p *Profile) ByName(name string) (*Spec, bool) {
	if s, ok := p.byName[name]; ok {
		return s, true
	}
	for i := range p.Requests {
		if p.Requests[i].Handler == name {
			return &p.Requests[i], true
		}
	}
	return nil, false
}

// Bad-input kinds: those DecodeRequest reports, those the server counts while
// dispatching and answering, and the shipped profiles' unsupported kind.
const (
	KindShort       = "short_message" // fewer than 3 frames (identity, uid, type)
	KindBadHeader   = "bad_header"    // uid or type frame is not a msgpack int
	KindUnknownType = "unknown_type"  // type number not in the profile
	KindArity       = "wrong_arity"   // payload frame count matches no shape
	KindPayload     = "bad_payload"   // a payload frame does not decode
	KindOversized   = "oversized"     // message larger than the configured maximum
	KindNoHandler   = "no_handler"    // known request, no handler registered
	KindHandlerErr  = "handler_error" // the handler returned an error
	KindPanic       = "handler_panic" // the handler panicked
	KindTooMany     = "too_many_frames"
	// KindAmbiguous is a message of a peer whose table is not known yet
	// (--protocol auto) that its candidate tables read as different
	// requests, none of which may run on a guess: dropped unanswered.
	KindAmbiguous = "ambiguous_unanswered"
	// KindCUDAUnsupported is the unsupported kind the shipped profiles give
	// the GPU-path requests (REGISTER_KV_CACHE, STORE, RETRIEVE): counted and
	// dropped, never dispatched.
	KindCUDAUnsupported = "cuda_unsupported"
	// KindSendFailed counts replies the socket could not send.
	KindSendFailed = "send_failed"
)

// DecodeError is a request that could not be decoded; Kind is one of the Kind*
// constants. Spec is set once the type number was recognised.
type DecodeError struct {
	Kind string
	Spec *Spec
	Err  error
}

func (e *DecodeError) Error() string {
	if e.Spec != nil {
		return fmt.Sprintf("%s: %s (%d): %v", e.Kind, e.Spec.Name, e.Spec.Number, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.Kind, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// DecodeHeader decodes the uid and type frames (each one msgpack int).
func DecodeHeader(uid, typ []byte) (uidVal, typeVal int64, err error) {
	v, err := DecodeValue(TypeInt, uid)
	if err != nil {
		return 0, 0, fmt.Errorf("uid frame: %w", err)
	}
	uidVal = v.(int64)
	v, err = DecodeValue(TypeInt, typ)
	if err != nil {
		return 0, 0, fmt.Errorf("type frame: %w", err)
	}
	return uidVal, v.(int64), nil
}

// DecodeRequest decodes frames [uid, type, payload…] (the identity already
// stripped) under the profile. On failure the error is a *DecodeError. Spec
// with a non-empty Unsupported is returned without decoding the payload.
func (p *Profile) DecodeRequest(frames [][]byte) (*Spec, []any, error) {
	spec, err := p.DecodeHead(frames)
	if err != nil || spec.Unsupported != "" {
		return spec, nil, err
	}
	args, err := p.DecodePayload(spec, frames[2:])
	return spec, args, err
}

// DecodeHead is the first half of DecodeRequest: the uid and type frames and
// the request's spec, leaving the payload for DecodePayload (so a server can
// decode it on the goroutine that runs the request).
func (p *Profile) DecodeHead(frames [][]byte) (*Spec, error) {
	if len(frames) < 2 {
		return nil, &DecodeError{Kind: KindShort, Err: fmt.Errorf("%d frames after the identity, want at least 2", len(frames))}
	}
	_, num, err := DecodeHeader(frames[0], frames[1])
	if err != nil {
		return nil, &DecodeError{Kind: KindBadHeader, Err: err}
	}
	spec, ok := p.ByNumber(num)
	if !ok {
		return nil, &DecodeError{Kind: KindUnknownType, Err: fmt.Errorf("type %d is not in profile %s", num, p.Name)}
	}
	return spec, nil
}

// DecodePayload is the second half of DecodeRequest: the payload frames of a
// request of spec, checked for arity and decoded by the spec's types under
// DefaultLimits.
func (p *Profile) DecodePayload(spec *Spec, payload [][]byte) ([]any, error) {
	return p.DecodePayloadLimits(spec, payload, DefaultLimits())
}

// DecodePayloadLimits is DecodePayload under the given limits.
func (p *Profile) DecodePayloadLimits(spec *Spec, payload [][]byte, lim Limits) ([]any, error) {
	if p.Message() {
		return decodeMessage(spec, payload, lim)
	}
	var shape []string
	for _, s := range spec.Shapes() {
		if len(s) == len(payload) {
			shape = s
			break
		}
	}
	if !arityMatches(spec, len(payload)) {
		return nil, &DecodeError{Kind: KindArity, Spec: spec,
			Err: fmt.Errorf("%d payload frames, want %s", len(payload), arityText(spec))}
	}
	args := make([]any, len(payload))
	for i, t := range shape {
		v, err := DecodeValueLimits(t, payload[i], lim)
		if err != nil {
			return nil, &DecodeError{Kind: KindPayload, Spec: spec, Err: fmt.Errorf("payload frame %d: %w", i, err)}
		}
		args[i] = v
	}
	return args, nil
}

func arityMatches(s *Spec, n int) bool {
	for _, shape := range s.Shapes() {
		if len(shape) == n {
			return true
		}
	}
	return false
}

func arityText(s *Spec) string {
	var out string
	for i, shape := range s.Shapes() {
		if i > 0 {
			out += " or "
		}
		out += fmt.Sprintf("%d %v", len(shape), shape)
	}
	return out
}
