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
// it is used: every count and string is bounded, every object lies inside
// the pool, aligned, with no two overlapping, every name index resolves.
// Take reads and removes it in one step, so a record is used at most once
// and a later crash finds none.
package restart

import (
	"bytes"
	"cmp"
	"crypto/sha256"
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

// Version is the record format this build writes and reads.
const Version = 1

// magic starts the header line: "kvdock-state <version> <body bytes> <sha256 hex>\n".
const magic = "kvdock-state"

// Bounds on what a record may hold; a record past one is refused whole.
const (
	MaxFileBytes     = 1 << 30
	MaxObjects       = 1 << 22
	MaxNames         = 1 << 16
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
	Segment  string // normalised segment name when not Auto
	Size     int64
	Align    int64
}

// Match says why r may not be adopted for w ("" when it may).
func Match(r Record, w Want) string {
	switch {
	case r.Endpoint != w.Endpoint:
		return fmt.Sprintf("recorded for %s, this server is %s", r.Endpoint, w.Endpoint)
	case r.Auto != w.Auto && r.Auto:
		return fmt.Sprintf("the kept segment %s was named automatically, --shm-name now names %s", r.Pool.Segment.Name, w.Segment)
	case r.Auto != w.Auto:
		return fmt.Sprintf("the kept segment %s was named by --shm-name, which is now unset (auto)", r.Pool.Segment.Name)
	case !w.Auto && r.Pool.Segment.Name != w.Segment:
		return fmt.Sprintf("the kept segment is %s, --shm-name now names %s", r.Pool.Segment.Name, w.Segment)
	case r.Pool.Size != w.Size:
		return fmt.Sprintf("the kept pool has %d bytes, l1.size_gb now gives %d", r.Pool.Size, w.Size)
	case r.Pool.Align != w.Align:
		return fmt.Sprintf("the kept pool is aligned to %d bytes, l1.align_bytes is now %d", r.Pool.Align, w.Align)
	}
	return ""
}

// The body's JSON form: short field names, model and salt strings once.
type body struct {
	Build      string    `json:"build"`
	Generation uint64    `json:"generation"`
	PID        int       `json:"pid"`
	Endpoint   string    `json:"endpoint"`
	StoppedAt  int64     `json:"stopped_at_ns"`
	WrittenAt  int64     `json:"written_at_ns"`
	Auto       bool      `json:"auto"`
	Segment    segment   `json:"segment"`
	Size       int64     `json:"size"`
	Align      int64     `json:"align"`
	Names      []name    `json:"names"`
	Objects    []object  `json:"objects"`
	Regs       []regWire `json:"registrations"`
	Lookups    []lookup  `json:"lookups,omitempty"`
}

type lookup struct {
	ID      string `json:"id"`
	Hits    int    `json:"hits"`
	Created int64  `json:"created_ns"`
}

type segment struct {
	Name string `json:"name"`
	Dev  uint64 `json:"dev"`
	Ino  uint64 `json:"ino"`
	Size int64  `json:"size"`
	UID  uint32 `json:"uid"`
}

type name struct {
	Model string `json:"m"`
	Salt  string `json:"s"`
}

type object struct {
	Chunk    string `json:"c"`
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
}

type regWire struct {
	ID         int64                    `json:"id"`
	Profile    string                   `json:"profile"`
	Mode       string                   `json:"mode"`
	Registered int64                    `json:"registered_ns"`
	Payload    protocol.RegisterPayload `json:"payload"`
}

// Encode renders r as a record file: the header line, then the body.
func Encode(r Record) ([]byte, error) {
	b := body{
		Build: r.Build, Generation: r.Generation, PID: r.PID, Endpoint: r.Endpoint,
		StoppedAt: r.StoppedAt.UnixNano(), WrittenAt: r.WrittenAt.UnixNano(), Auto: r.Auto,
		Segment: segment{Name: r.Pool.Segment.Name, Dev: r.Pool.Segment.Dev, Ino: r.Pool.Segment.Ino,
			Size: r.Pool.Segment.Size, UID: r.Pool.Segment.UID},
		Size: r.Pool.Size, Align: r.Pool.Align,
		Names:   []name{},
		Objects: make([]object, 0, len(r.Pool.Objects)),
		Regs:    make([]regWire, 0, len(r.Registrations)),
	}
	idx := map[name]int{}
	for _, o := range r.Pool.Objects {
		n := name{o.Key.Model, o.Key.Salt}
		i, ok := idx[n]
		if !ok {
			i = len(b.Names)
			idx[n] = i
			b.Names = append(b.Names, n)
		}
		b.Objects = append(b.Objects, object{Chunk: hex.EncodeToString(o.Key.Chunk[:]), Name: i, Rank: o.Key.KVRank,
			Group: o.Key.Group, Off: o.Offset, Len: o.Length, Held: o.Held, Write: o.Write,
			Readers: o.Readers, Holds: o.Holds, Deadline: o.Deadline})
	}
	for _, g := range r.Registrations {
		b.Regs = append(b.Regs, regWire{ID: g.ID, Profile: g.Profile, Mode: g.Mode, Registered: g.Registered.UnixNano(), Payload: g.Payload})
	}
	for _, l := range r.Lookups {
		b.Lookups = append(b.Lookups, lookup{ID: l.RequestID, Hits: l.HitChunks, Created: l.Created.UnixNano()})
	}
	js, err := json.Marshal(b)
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

// Decode parses and validates a record file in full; every refusal wraps
// ErrInvalid and says what was wrong.
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
	var b body
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return bad("body: %v", err)
	}
	if dec.More() {
		return bad("body: data after the record")
	}
	if err := b.check(); err != nil {
		return bad("%v", err)
	}
	r := Record{Build: b.Build, Generation: b.Generation, PID: b.PID, Endpoint: b.Endpoint,
		StoppedAt: time.Unix(0, b.StoppedAt), WrittenAt: time.Unix(0, b.WrittenAt), Auto: b.Auto,
		Pool: l1.Kept{Segment: l1.SegmentIdentity{Name: b.Segment.Name, Dev: b.Segment.Dev, Ino: b.Segment.Ino,
			Size: b.Segment.Size, UID: b.Segment.UID}, Size: b.Size, Align: b.Align,
			Objects: make([]l1.KeptObject, len(b.Objects))},
		Registrations: make([]Registration, len(b.Regs)),
	}
	for i, o := range b.Objects {
		var h keys.Hash
		_, _ = hex.Decode(h[:], []byte(o.Chunk)) // checked
		n := b.Names[o.Name]
		r.Pool.Objects[i] = l1.KeptObject{Key: keys.ObjectKey{Chunk: h, Model: n.Model, Salt: n.Salt, KVRank: o.Rank, Group: o.Group},
			Offset: o.Off, Length: o.Len, Held: o.Held, Write: o.Write, Readers: o.Readers, Holds: o.Holds, Deadline: o.Deadline}
	}
	for i, g := range b.Regs {
		r.Registrations[i] = Registration{ID: g.ID, Profile: g.Profile, Mode: g.Mode, Registered: time.Unix(0, g.Registered), Payload: g.Payload}
	}
	for _, l := range b.Lookups {
		r.Lookups = append(r.Lookups, Lookup{RequestID: l.ID, HitChunks: l.Hits, Created: time.Unix(0, l.Created)})
	}
	return r, nil
}

// check validates a decoded body: bounds, geometry, every object inside the
// pool and aligned, no overlaps, every reference resolved.
func (b *body) check() error {
	var errs []error
	str := func(what, s string) {
		if len(s) > MaxStringBytes {
			errs = append(errs, fmt.Errorf("%s is %d bytes, at most %d", what, len(s), MaxStringBytes))
		}
	}
	str("build", b.Build)
	str("endpoint", b.Endpoint)
	str("segment name", b.Segment.Name)
	// A record without a pool (its pool was private memory) carries the
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
	switch {
	case len(b.Names) > MaxNames:
		return fmt.Errorf("%d names, at most %d", len(b.Names), MaxNames)
	case !poolless && (len(b.Objects) > MaxObjects || int64(len(b.Objects)) > b.Size/b.Align):
		return fmt.Errorf("%d objects, at most %d (and one per %d-byte unit of the pool)", len(b.Objects), MaxObjects, b.Align)
	case len(b.Regs) > MaxRegistrations:
		return fmt.Errorf("%d registrations, at most %d", len(b.Regs), MaxRegistrations)
	case len(b.Lookups) > MaxLookups:
		return fmt.Errorf("%d lookups, at most %d", len(b.Lookups), MaxLookups)
	}
	for i, n := range b.Names {
		str(fmt.Sprintf("name %d model", i), n.Model)
		str(fmt.Sprintf("name %d salt", i), n.Salt)
	}
	type span struct{ off, end int64 }
	spans := make([]span, 0, len(b.Objects))
	for i, o := range b.Objects {
		if len(errs) > 8 {
			break
		}
		var h keys.Hash
		if len(o.Chunk) != 2*len(h) {
			errs = append(errs, fmt.Errorf("object %d: chunk hash of %d characters, want %d hex digits", i, len(o.Chunk), 2*len(h)))
		} else if _, err := hex.Decode(h[:], []byte(o.Chunk)); err != nil {
			errs = append(errs, fmt.Errorf("object %d: chunk hash: %v", i, err))
		}
		if o.Name < 0 || o.Name >= len(b.Names) {
			errs = append(errs, fmt.Errorf("object %d: name index %d outside the %d names", i, o.Name, len(b.Names)))
		}
		rounded := (o.Len + b.Align - 1) &^ (b.Align - 1)
		switch {
		case o.Len <= 0 || rounded <= 0:
			errs = append(errs, fmt.Errorf("object %d: length %d, want > 0", i, o.Len))
			continue
		case o.Off < 0 || o.Off&(b.Align-1) != 0:
			errs = append(errs, fmt.Errorf("object %d: offset %d not aligned to %d", i, o.Off, b.Align))
			continue
		case o.Off > b.Size || rounded > b.Size-o.Off:
			errs = append(errs, fmt.Errorf("object %d: [%d, +%d) passes the pool of %d bytes", i, o.Off, rounded, b.Size))
			continue
		case o.Write && !o.Held:
			errs = append(errs, fmt.Errorf("object %d: a write reservation recorded as readable", i))
		case (o.Readers > 0 || o.Holds > 0 || o.Write) && o.Deadline <= 0:
			errs = append(errs, fmt.Errorf("object %d: locked without a deadline", i))
		}
		spans = append(spans, span{o.Off, o.Off + rounded})
	}
	slices.SortFunc(spans, func(x, y span) int { return cmp.Compare(x.off, y.off) })
	for i := 1; i < len(spans) && len(errs) <= 8; i++ {
		if spans[i].off < spans[i-1].end {
			errs = append(errs, fmt.Errorf("objects at %d and %d overlap", spans[i-1].off, spans[i].off))
		}
	}
	seen := make(map[int64]bool, len(b.Regs))
	for i, g := range b.Regs {
		if len(errs) > 8 {
			break
		}
		if seen[g.ID] {
			errs = append(errs, fmt.Errorf("registration %d: instance %d recorded twice", i, g.ID))
		}
		seen[g.ID] = true
		if g.Payload.InstanceID != g.ID {
			errs = append(errs, fmt.Errorf("registration %d: payload names instance %d, not %d", i, g.Payload.InstanceID, g.ID))
		}
		str(fmt.Sprintf("registration %d profile", i), g.Profile)
		str(fmt.Sprintf("registration %d model", i), g.Payload.ModelName)
		str(fmt.Sprintf("registration %d dtype", i), g.Payload.DtypeStr)
		if g.Mode != "SHM" && g.Mode != "PICKLE" {
			errs = append(errs, fmt.Errorf("registration %d: mode %q, want SHM or PICKLE", i, bounded(g.Mode)))
		}
		if n := len(g.Payload.GroupLayouts); n > protocol.MaxGroupLayouts {
			errs = append(errs, fmt.Errorf("registration %d: %d group layouts, at most %d", i, n, protocol.MaxGroupLayouts))
		}
		for j, gl := range g.Payload.GroupLayouts {
			str(fmt.Sprintf("registration %d group %d dtype", i, j), gl.DtypeStr)
		}
	}
	for i, l := range b.Lookups {
		if len(errs) > 8 {
			break
		}
		str(fmt.Sprintf("lookup %d request id", i), l.ID)
		if l.Hits < 0 || l.Hits > MaxObjects || l.Created <= 0 {
			errs = append(errs, fmt.Errorf("lookup %d: %d hits created at %d ns, want 0 to %d hits and a time", i, l.Hits, l.Created, MaxObjects))
		}
	}
	return errors.Join(errs...)
}

// bounded cuts an outside string for an error message.
func bounded(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
