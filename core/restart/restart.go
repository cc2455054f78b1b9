// Package restart is the record a kvdock stopping for a restart leaves for
// its successor: the kept L1 pool (segment identity, geometry, object table)
// and the worker registrations, with the build and the time it stopped.
//
// It also carries the LOOKUPs answered and not yet queried, so that a
// QUERY_PREFETCH_STATUS reaching the successor gets the hits its
// predecessor found (their read locks are in the kept table).
//
// The record is outside input to whoever reads it, like any file: it lives
// in a directory only our user can write (mode 0700; a directory or file of
// another user, writable by others, or a symbolic link is refused), is
// written atomically with mode 0600, carries a version, its length and a
// SHA-256 of its body, and Decode validates it in full before anything in
// it is used. Damage to its structure (header, length, checksum, syntax,
// the pool's geometry, overlapping objects) refuses it whole; an object,
// registration or lookup that is bad on its own, or past a bound (objects
// by the pool's units, names by the objects and registrations), is left
// out alone with the reason, so a peer that fills one table costs only
// what does not fit. Every string (model names, salts, request ids) is
// kept byte for byte. Take reads and removes it in one step, so a record
// is used at most once and a later crash finds none.
package restart

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/protocol"
)

// Version is the record format this build writes and reads: 2 keeps
// every string byte for byte (base64); a record of another version is
// refused with the reason.
const Version = 2

// magic starts the header line: "kvdock-state <version> <body bytes> <sha256 hex>\n".
const magic = "kvdock-state"

// Bounds on what a record may hold. A file past MaxFileBytes is refused
// whole; past the other bounds the parts that do not fit are left out one
// by one (Record.Dropped), and objects are bounded by the pool too (one
// per alignment unit), names by the objects and registrations.
const (
	MaxFileBytes     = 1 << 30
	MaxObjects       = 1 << 22
	MaxRegistrations = 1 << 16
	MaxLookups       = 1 << 16
	MaxStringBytes   = 1024
	maxHeaderBytes   = 128
)

// ErrInvalid wraps every reason a record is refused.
var ErrInvalid = errors.New("restart record refused")

// Registration is one registered worker instance.
type Registration struct {
	ID         int64
	Profile    string // the protocol table it registered through ("" = the server's)
	Mode       string // SHM or PICKLE
	Registered time.Time
	Payload    protocol.RegisterPayload
}

// Record is what a stopping kvdock leaves for its successor.
type Record struct {
	Build      string
	Generation uint64
	PID        int
	// Endpoint is host:port of the wire server that wrote it.
	Endpoint string
	// StoppedAt is when it stopped reading requests: the gap starts there.
	StoppedAt time.Time
	WrittenAt time.Time
	// Auto: the segment was named by the pid (no --shm-name).
	Auto          bool
	Pool          l1.Kept
	Registrations []Registration
	// Lookups are the LOOKUPs answered and not queried yet, oldest first.
	Lookups []Lookup
	// Transfers are the transfers a worker was answered a prepare for and
	// has not committed yet, carried so that its commit to the successor
	// publishes or releases what it was given (transfers.go); CarryKey is
	// the secret their keys are hashed with.
	Transfers []Transfer
	CarryKey  []byte
	// Handover is how the stop that wrote the record ended its wire
	// server: requests parked and answered, and requests that arrived after
	// the last answer (never answered).
	Handover Handover
	// Dropped is what Decode left out part by part, with the reasons (not
	// written: Encode ignores it).
	Dropped l1.Drops

	// The operator's view (stats.go; the prompt links travel in
	// Pool.Objects, links.go): the statistics handed to the successor (nil:
	// none), and what Decode left out of the record, each with the reason
	// (the rest is used).
	Stats   *Stats
	Ignored []string
}

// Lookup is a LOOKUP whose outcome waits for its QUERY_PREFETCH_STATUS.
type Lookup struct {
	RequestID string
	HitChunks int
	Created   time.Time
}

// Want is the pool a starting kvdock would build from its settings.
type Want struct {
	Endpoint string
	Auto     bool
	// Segment is the normalised segment name when not Auto, or the
	// private segment (l1.IsPrivateSegment) of a pool that is not shared.
	Segment string
	Size    int64
	Align   int64
}

// Match says why r may not be adopted for w ("" when it may). A pool
// never changes between shared and private (--shm-name "") across a
// restart; a private plan adopts the kept private segment whatever its
// name, as auto naming does (an endpoint changed in place kept the name
// of the old one), since nobody is told that name.
func Match(r Record, w Want) string {
	switch kept, private := r.Pool.Segment.Name, l1.IsPrivateSegment(w.Segment); {
	case r.Endpoint != w.Endpoint:
		return fmt.Sprintf("recorded for %s, this server is %s", r.Endpoint, w.Endpoint)
	case l1.IsPrivateSegment(kept) && !private:
		return fmt.Sprintf("the kept pool is the private segment %s (--shm-name \"\"), this start's pool is shared", kept)
	case private && !l1.IsPrivateSegment(kept):
		return fmt.Sprintf("the kept segment %s is shared, this start's pool is private (--shm-name \"\")", kept)
	case r.Auto != w.Auto && r.Auto:
		return fmt.Sprintf("the kept segment %s was named automatically, --shm-name now names %s", r.Pool.Segment.Name, w.Segment)
	case r.Auto != w.Auto:
		return fmt.Sprintf("the kept segment %s was named by --shm-name, which is now unset (auto)", r.Pool.Segment.Name)
	case !w.Auto && !private && r.Pool.Segment.Name != w.Segment:
		return fmt.Sprintf("the kept segment is %s, --shm-name now names %s", r.Pool.Segment.Name, w.Segment)
	case r.Pool.Size != w.Size:
		return fmt.Sprintf("the kept pool has %d bytes, l1.size_gb now gives %d", r.Pool.Size, w.Size)
	case r.Pool.Align != w.Align:
		return fmt.Sprintf("the kept pool is aligned to %d bytes, l1.align_bytes is now %d", r.Pool.Align, w.Align)
	}
	return ""
}

// The body's JSON form: short field names, model and salt strings once.
// Every string is an exact (base64 of its bytes): JSON text holds only
// UTF-8, and encoding/json turns each invalid byte into U+FFFD, which would
// make the salts ff fe and "\ufffd\ufffd" one salt after a restart. A new
// field that holds a peer's string is an exact too.
type body struct {
	Build      exact      `json:"build"`
	Generation uint64     `json:"generation"`
	PID        int        `json:"pid"`
	Endpoint   exact      `json:"endpoint"`
	StoppedAt  int64      `json:"stopped_at_ns"`
	WrittenAt  int64      `json:"written_at_ns"`
	Auto       bool       `json:"auto"`
	Segment    segment    `json:"segment"`
	Size       int64      `json:"size"`
	Align      int64      `json:"align"`
	Names      []name     `json:"names"`
	Objects    objectList `json:"objects"`
	Regs       []regWire  `json:"registrations"`
	Lookups    []lookup   `json:"lookups,omitempty"`
	Transfers  []transfer `json:"transfers,omitempty"`
	Handover   Handover   `json:"handover"`
	CarryKey   []byte     `json:"carry_key,omitempty"`
	// Decoded apart (links.go, order.go, stats.go): a bad block is left
	// out alone.
	Links json.RawMessage `json:"links,omitempty"`
	Order json.RawMessage `json:"order,omitempty"`
	Stats json.RawMessage `json:"stats,omitempty"`
}

// exact is a string the record keeps byte for byte: written as the
// standard base64 of its bytes in a JSON string.
type exact string

// MarshalJSON writes the base64 of s's bytes.
func (s exact) MarshalJSON() ([]byte, error) {
	out := make([]byte, 0, base64.StdEncoding.EncodedLen(len(s))+2)
	out = append(out, '"')
	out = base64.StdEncoding.AppendEncode(out, []byte(s))
	return append(out, '"'), nil
}

// UnmarshalJSON reads what MarshalJSON wrote; anything else is refused.
func (s *exact) UnmarshalJSON(b []byte) error {
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return fmt.Errorf("string %s: want base64 in a JSON string", bounded(string(b)))
	}
	v, err := base64.StdEncoding.AppendDecode(nil, b[1:len(b)-1])
	if err != nil {
		return fmt.Errorf("string %s: %w", bounded(string(b)), err)
	}
	*s = exact(v)
	return nil
}

type lookup struct {
	ID      exact `json:"id"`
	Hits    int   `json:"hits"`
	Created int64 `json:"created_ns"`
}

type segment struct {
	Name exact  `json:"name"`
	Dev  uint64 `json:"dev"`
	Ino  uint64 `json:"ino"`
	Size int64  `json:"size"`
	UID  uint32 `json:"uid"`
}

type name struct {
	Model exact `json:"m"`
	Salt  exact `json:"s"`
	// Layout is the objects' layout ID (keys.ObjectKey.Layout), so a kept
	// object is adopted under its own layout's key.
	Layout uint64 `json:"l,omitempty"`
}

type object struct {
	Chunk    string `json:"c"` // hex
	Name     int    `json:"n"`
	Rank     uint32 `json:"r"`
	Group    uint32 `json:"g"`
	Off      int64  `json:"o"`
	Len      int64  `json:"l"`
	Held     bool   `json:"h,omitempty"`
	Write    bool   `json:"w,omitempty"`
	Readers  uint32 `json:"rd,omitempty"`
	Holds    uint32 `json:"hd,omitempty"`
	Deadline int64  `json:"d,omitempty"`
	Live     bool   `json:"lv,omitempty"`
}

type regWire struct {
	ID         int64   `json:"id"`
	Profile    exact   `json:"profile"`
	Mode       exact   `json:"mode"`
	Registered int64   `json:"registered_ns"`
	Payload    payload `json:"payload"`
}

// payload is protocol.RegisterPayload with its strings kept exactly.
type payload struct {
	InstanceID    int64   `json:"instance"`
	ModelName     exact   `json:"model"`
	WorldSize     int     `json:"world_size"`
	BlockSize     int     `json:"block_size"`
	NumLayers     int     `json:"layers"`
	HiddenDimSize int     `json:"hidden"`
	DtypeStr      exact   `json:"dtype"`
	UseMLA        bool    `json:"mla,omitempty"`
	GroupLayouts  []group `json:"groups,omitempty"`
}

type group struct {
	BlockSize      int   `json:"block_size"`
	NumLayers      int   `json:"layers"`
	HiddenDimSize  int   `json:"hidden"`
	DtypeStr       exact `json:"dtype"`
	UseMLA         bool  `json:"mla,omitempty"`
	TokensPerBlock int   `json:"tokens_per_block"`
}

func payloadWire(p protocol.RegisterPayload) payload {
	w := payload{InstanceID: p.InstanceID, ModelName: exact(p.ModelName), WorldSize: p.WorldSize, BlockSize: p.BlockSize,
		NumLayers: p.NumLayers, HiddenDimSize: p.HiddenDimSize, DtypeStr: exact(p.DtypeStr), UseMLA: p.UseMLA}
	for _, g := range p.GroupLayouts {
		w.GroupLayouts = append(w.GroupLayouts, group{BlockSize: g.BlockSize, NumLayers: g.NumLayers, HiddenDimSize: g.HiddenDimSize,
			DtypeStr: exact(g.DtypeStr), UseMLA: g.UseMLA, TokensPerBlock: g.TokensPerBlock})
	}
	return w
}

func (w payload) register() protocol.RegisterPayload {
	p := protocol.RegisterPayload{InstanceID: w.InstanceID, ModelName: string(w.ModelName), WorldSize: w.WorldSize, BlockSize: w.BlockSize,
		NumLayers: w.NumLayers, HiddenDimSize: w.HiddenDimSize, DtypeStr: string(w.DtypeStr), UseMLA: w.UseMLA}
	for _, g := range w.GroupLayouts {
		p.GroupLayouts = append(p.GroupLayouts, protocol.GroupLayout{BlockSize: g.BlockSize, NumLayers: g.NumLayers,
			HiddenDimSize: g.HiddenDimSize, DtypeStr: string(g.DtypeStr), UseMLA: g.UseMLA, TokensPerBlock: g.TokensPerBlock})
	}
	return p
}

// Encode renders r as a record file: the header line, then the body.
func Encode(r Record) ([]byte, error) {
	b := body{
		Build: exact(r.Build), Generation: r.Generation, PID: r.PID, Endpoint: exact(r.Endpoint),
		StoppedAt: r.StoppedAt.UnixNano(), WrittenAt: r.WrittenAt.UnixNano(), Auto: r.Auto,
		Segment: segment{Name: exact(r.Pool.Segment.Name), Dev: r.Pool.Segment.Dev, Ino: r.Pool.Segment.Ino,
			Size: r.Pool.Segment.Size, UID: r.Pool.Segment.UID},
		Size: r.Pool.Size, Align: r.Pool.Align,
		Names:   []name{},
		Objects: make(objectList, 0, len(r.Pool.Objects)),
		Regs:    make([]regWire, 0, len(r.Registrations)),
	}
	idx := map[name]int{}
	for _, o := range r.Pool.Objects {
		n := name{exact(o.Key.Model), exact(o.Key.Salt), o.Key.Layout}
		i, ok := idx[n]
		if !ok {
			i = len(b.Names)
			idx[n] = i
			b.Names = append(b.Names, n)
		}
		b.Objects = append(b.Objects, object{Chunk: hex.EncodeToString(o.Key.Chunk[:]), Name: i, Rank: o.Key.KVRank,
			Group: o.Key.Group, Off: o.Offset, Len: o.Length, Held: o.Held, Write: o.Write,
			Readers: o.Readers, Holds: o.Holds, Deadline: o.Deadline, Live: o.Live && o.Write && o.Held})
	}
	for _, g := range r.Registrations {
		b.Regs = append(b.Regs, regWire{ID: g.ID, Profile: exact(g.Profile), Mode: exact(g.Mode), Registered: g.Registered.UnixNano(),
			Payload: payloadWire(g.Payload)})
	}
	for _, l := range r.Lookups {
		b.Lookups = append(b.Lookups, lookup{ID: exact(l.RequestID), Hits: l.HitChunks, Created: l.Created.UnixNano()})
	}
	b.Transfers, b.CarryKey, b.Handover = encodeTransfers(r.Transfers), r.CarryKey, r.Handover
	b.Links = encodeLinks(r.Pool.Objects)
	b.Order = encodeOrder(r.Pool)
	st, err := encodeStats(r.Stats)
	if err != nil {
		return nil, fmt.Errorf("restart: encode record: %w", err)
	}
	b.Stats = st
	js, err := marshalBody(b)
	if err != nil {
		return nil, fmt.Errorf("restart: encode record: %w", err)
	}
	if len(js) > MaxFileBytes-maxHeaderBytes {
		return nil, fmt.Errorf("restart: record of %d bytes passes the bound of %d", len(js), MaxFileBytes)
	}
	sum := sha256.Sum256(js)
	out := fmt.Appendf(nil, "%s %d %d %s\n", magic, Version, len(js), hex.EncodeToString(sum[:]))
	return append(out, js...), nil
}

// Decode parses and validates a record file in full; a refusal wraps
// ErrInvalid and says what was wrong. Damage to the structure (header,
// length, checksum, syntax, the pool's geometry, objects that overlap)
// refuses the whole record; a part that is bad or past its bound on its
// own (an object, a registration, a lookup) is left out with the reason,
// counted in Record.Dropped.
func Decode(data []byte) (Record, error) {
	bad := func(format string, args ...any) (Record, error) {
		return Record{}, fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	if len(data) > MaxFileBytes {
		return bad("%d bytes, more than the bound of %d", len(data), MaxFileBytes)
	}
	nl := bytes.IndexByte(data[:min(len(data), maxHeaderBytes)], '\n')
	if nl < 0 {
		return bad("no header line (not a kvdock state file, or truncated)")
	}
	f := strings.Fields(string(data[:nl]))
	if len(f) != 4 || f[0] != magic {
		return bad("header %q is not a kvdock state header", bounded(string(data[:nl])))
	}
	if v, err := strconv.Atoi(f[1]); err != nil || v != Version {
		return bad("format version %q, this build reads %d", bounded(f[1]), Version)
	}
	n, err := strconv.Atoi(f[2])
	js := data[nl+1:]
	if err != nil || n != len(js) {
		return bad("header says %q body bytes, the file has %d (truncated or appended to)", bounded(f[2]), len(js))
	}
	sum := sha256.Sum256(js)
	if hex.EncodeToString(sum[:]) != f[3] {
		return bad("checksum mismatch: the body was changed or corrupted")
	}
	b, parsed, err := decodeBody(js)
	if err != nil {
		return bad("%v", err)
	}
	if err := b.geometry(); err != nil {
		return bad("%v", err)
	}
	r := Record{Build: string(b.Build), Generation: b.Generation, PID: b.PID, Endpoint: string(b.Endpoint),
		StoppedAt: time.Unix(0, b.StoppedAt), WrittenAt: time.Unix(0, b.WrittenAt), Auto: b.Auto,
		Pool: l1.Kept{Segment: l1.SegmentIdentity{Name: string(b.Segment.Name), Dev: b.Segment.Dev, Ino: b.Segment.Ino,
			Size: b.Segment.Size, UID: b.Segment.UID}, Size: b.Size, Align: b.Align},
	}
	var from []int
	if r.Pool.Objects, from, err = b.objects(&r.Dropped); err != nil {
		return bad("%v", err)
	}
	r.Registrations = b.registrations(&r.Dropped)
	r.Lookups = b.lookups(&r.Dropped)
	r.Transfers, r.CarryKey = b.transfers(r.Pool.Objects, &r.Dropped)
	r.Handover = b.Handover.bounded(&r.Dropped)
	if why := decodeLinks(b.Links, parsed.links, len(b.Objects), from, r.Pool.Objects); why != "" {
		r.Ignored = append(r.Ignored, why)
	}
	if why := decodeOrder(b.Order, parsed.order, len(b.Objects), from, &r.Pool); why != "" {
		r.Ignored = append(r.Ignored, why)
	}
	var ignored []string
	r.Stats, ignored = decodeStats(b.Stats, r.WrittenAt)
	r.Ignored = append(r.Ignored, ignored...)
	return r, nil
}

// geometry checks what the whole record stands on: its own strings and
// the pool's size, alignment and segment.
func (b *body) geometry() error {
	for _, f := range []struct {
		what string
		s    exact
	}{{"build", b.Build}, {"endpoint", b.Endpoint}, {"segment name", b.Segment.Name}} {
		if len(f.s) > MaxStringBytes {
			return fmt.Errorf("%s is %d bytes, at most %d", f.what, len(f.s), MaxStringBytes)
		}
	}
	// A record without a pool (its pool was anonymous memory) carries the
	// registrations alone.
	poolless := b.Segment == segment{} && b.Size == 0 && b.Align == 0 && len(b.Objects) == 0 && len(b.Lookups) == 0
	switch {
	case poolless:
	case b.Size <= 0 || b.Align <= 0 || b.Align&(b.Align-1) != 0 || b.Size < b.Align:
		return fmt.Errorf("pool of %d bytes aligned to %d: want a power-of-two alignment no larger than the pool", b.Size, b.Align)
	case b.Segment.Size != b.Size:
		return fmt.Errorf("segment of %d bytes for a pool of %d", b.Segment.Size, b.Size)
	case b.Segment.Name == "":
		return errors.New("no segment name: only a shared segment can be kept")
	}
	return nil
}

// locked reports whether o holds a lock of any kind.
func (o *object) locked() bool { return o.Write || o.Readers > 0 || o.Holds > 0 }

// objects checks the recorded objects against the pool: at most one per
// alignment unit of the pool (and MaxObjects), the least recently used,
// unlocked ones first, left out past that; each inside the pool, aligned,
// its name resolved. An object whose key cannot be read but which is
// locked is kept held (never readable) so its holder's bytes are not
// handed out before its lock ends. Objects that overlap refuse the record.
// objects returns the usable objects and, for each, its index in the
// body (the prompt links name body indices).
func (b *body) objects(d *l1.Drops) ([]l1.KeptObject, []int, error) {
	names := b.names(d)
	skip := make([]bool, len(b.Objects))
	units := int64(0)
	if b.Align > 0 {
		units = b.Size / b.Align
	}
	if limit := int(min(int64(MaxObjects), units)); len(b.Objects) > limit {
		excess := len(b.Objects) - limit
		for pass := range 2 {
			for i := range b.Objects {
				if excess > 0 && !skip[i] && b.Objects[i].locked() == (pass == 1) {
					skip[i] = true
					excess--
				}
			}
		}
		d.AddN("objects past the pool's bound", len(b.Objects)-limit,
			fmt.Sprintf("%d objects, at most %d (one per %d-byte unit, at most %d)", len(b.Objects), limit, b.Align, MaxObjects))
	}
	out := make([]l1.KeptObject, 0, len(b.Objects))
	from := make([]int, 0, len(b.Objects))
	type span struct{ off, end int64 }
	spans := make([]span, 0, len(b.Objects))
	for i := range b.Objects {
		o := &b.Objects[i]
		if skip[i] {
			continue
		}
		rounded := (o.Len + b.Align - 1) &^ (b.Align - 1)
		switch {
		case o.Len <= 0 || rounded <= 0:
			d.Add("object of no length", fmt.Sprintf("object %d: length %d", i, o.Len))
			continue
		case o.Off < 0 || o.Off&(b.Align-1) != 0:
			d.Add("object not aligned", fmt.Sprintf("object %d: offset %d not aligned to %d", i, o.Off, b.Align))
			continue
		case o.Off > b.Size || rounded > b.Size-o.Off:
			d.Add("object outside the pool", fmt.Sprintf("object %d: [%d, +%d) passes the pool of %d bytes", i, o.Off, rounded, b.Size))
			continue
		case o.locked() && o.Deadline <= 0:
			d.Add("locked without a deadline", fmt.Sprintf("object %d", i))
			continue
		}
		k := l1.KeptObject{Offset: o.Off, Length: o.Len, Held: o.Held, Write: o.Write, Readers: o.Readers, Holds: o.Holds, Deadline: o.Deadline,
			Live: o.Live && o.Write && o.Held}
		key, why := b.key(o, names)
		if why == "" && o.Write && !o.Held {
			why = "a write reservation recorded as readable"
		}
		switch {
		case why != "" && !o.locked():
			d.Add(why, fmt.Sprintf("object %d", i))
			continue
		case why != "":
			d.Add(why+" (kept unreadable until its lock ends)", fmt.Sprintf("object %d", i))
			k.Held = true
		default:
			k.Key = key
		}
		out = append(out, k)
		from = append(from, i)
		spans = append(spans, span{o.Off, o.Off + rounded})
	}
	slices.SortFunc(spans, func(x, y span) int { return cmp.Compare(x.off, y.off) })
	for i := 1; i < len(spans); i++ {
		if spans[i].off < spans[i-1].end {
			return nil, nil, fmt.Errorf("objects at %d and %d overlap", spans[i-1].off, spans[i].off)
		}
	}
	return out, from, nil
}

// names returns the usable names, nil where a name is not: past the bound
// (one per object or registration) or with a string past MaxStringBytes.
func (b *body) names(d *l1.Drops) []*name {
	limit := min(len(b.Objects)+len(b.Regs), MaxObjects+MaxRegistrations)
	if len(b.Names) > limit {
		d.AddN("names past the bound", len(b.Names)-limit, fmt.Sprintf("%d names, at most %d (one per object or registration)", len(b.Names), limit))
	}
	out := make([]*name, min(len(b.Names), limit))
	for i := range out {
		if n := &b.Names[i]; len(n.Model) <= MaxStringBytes && len(n.Salt) <= MaxStringBytes {
			out[i] = n
		}
	}
	return out
}

// key reads o's key, or says why it cannot be read.
func (b *body) key(o *object, names []*name) (keys.ObjectKey, string) {
	var k keys.ObjectKey
	if len(o.Chunk) != 2*len(k.Chunk) {
		return k, "chunk hash not 64 hex digits"
	}
	if _, err := hex.Decode(k.Chunk[:], []byte(o.Chunk)); err != nil {
		return k, "chunk hash not 64 hex digits"
	}
	if o.Name < 0 || o.Name >= len(names) || names[o.Name] == nil {
		return k, "name unknown, or a string past the bound"
	}
	n := names[o.Name]
	k.Model, k.Salt, k.KVRank, k.Group, k.Layout = string(n.Model), string(n.Salt), o.Rank, o.Group, n.Layout
	return k, ""
}

// registrations returns the valid registrations, at most MaxRegistrations
// (the first); an instance recorded twice is left out, every copy, since
// neither can be told to be the worker's.
func (b *body) registrations(d *l1.Drops) []Registration {
	regs := b.Regs
	if len(regs) > MaxRegistrations {
		d.AddN("registrations past the bound", len(regs)-MaxRegistrations, fmt.Sprintf("%d registrations, at most %d", len(regs), MaxRegistrations))
		regs = regs[:MaxRegistrations]
	}
	count := make(map[int64]int, len(regs))
	for _, g := range regs {
		count[g.ID]++
	}
	out := make([]Registration, 0, len(regs))
	for i := range regs {
		g := &regs[i]
		if why := g.invalid(count[g.ID]); why != "" {
			d.Add("registration "+why, fmt.Sprintf("registration %d (instance %d)", i, g.ID))
			continue
		}
		out = append(out, Registration{ID: g.ID, Profile: string(g.Profile), Mode: string(g.Mode), Registered: time.Unix(0, g.Registered),
			Payload: g.Payload.register()})
	}
	return out
}

// invalid says what is wrong with g ("" when nothing); copies is how many
// registrations of its instance the record holds.
func (g *regWire) invalid(copies int) string {
	long := func(s exact) bool { return len(s) > MaxStringBytes }
	switch {
	case copies > 1:
		return "of an instance recorded twice"
	case g.Payload.InstanceID != g.ID:
		return fmt.Sprintf("whose payload names instance %d", g.Payload.InstanceID)
	case long(g.Profile) || long(g.Payload.ModelName) || long(g.Payload.DtypeStr):
		return fmt.Sprintf("with a string past %d bytes", MaxStringBytes)
	case g.Mode != "SHM" && g.Mode != "PICKLE":
		return fmt.Sprintf("of mode %q, want SHM or PICKLE", bounded(string(g.Mode)))
	case len(g.Payload.GroupLayouts) > protocol.MaxGroupLayouts:
		return fmt.Sprintf("with %d group layouts, at most %d", len(g.Payload.GroupLayouts), protocol.MaxGroupLayouts)
	}
	for _, gl := range g.Payload.GroupLayouts {
		if long(gl.DtypeStr) {
			return fmt.Sprintf("with a string past %d bytes", MaxStringBytes)
		}
	}
	return ""
}

// lookups returns the valid lookups, at most MaxLookups (the newest: the
// record lists them oldest first).
func (b *body) lookups(d *l1.Drops) []Lookup {
	ls := b.Lookups
	if len(ls) > MaxLookups {
		d.AddN("lookups past the bound", len(ls)-MaxLookups, fmt.Sprintf("%d lookups, at most %d (the oldest left out)", len(ls), MaxLookups))
		ls = ls[len(ls)-MaxLookups:]
	}
	var out []Lookup
	for i, l := range ls {
		if len(l.ID) > MaxStringBytes || l.Hits < 0 || l.Hits > MaxObjects || l.Created <= 0 {
			d.Add("lookup invalid", fmt.Sprintf("lookup %d: a %d-byte id, %d hits, created at %d ns", i, len(l.ID), l.Hits, l.Created))
			continue
		}
		out = append(out, Lookup{RequestID: string(l.ID), HitChunks: l.Hits, Created: time.Unix(0, l.Created)})
	}
	return out
}

// bounded cuts an outside string for an error message.
func bounded(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
