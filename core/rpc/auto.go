package rpc

import (
	"container/list"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"kvdock/core/protocol"
)

// Protocol auto-detection (--protocol auto): a message "fits" a table when
// its type number is in it and its payload decodes under it in full; each
// message keeps the peer's candidate tables it fits. One left: decided and
// logged with the evidence. Several that read the message as the same
// request: served, detection goes on. Several that disagree: see
// serveAmbiguous. A message that fits none (GPU-path requests included)
// narrows nothing. After maxUndecided messages the peer is settled on the
// tie-break.
//
// Registered instances come first (Options.Instances): a message that
// names a registered instance, read under the table that instance
// registered through, is served under that table whatever the peer's
// state says (decided otherwise, undecided, or forgotten: a restart or a
// flood of identities), and decides the peer; a peer that holds a
// registered instance (transfer/nongpu: the one that registered it or
// first spoke for it) is decided on its table at its first message. So a
// worker's transfers are never read under another table, and a worker's
// table is carried across a restart by its registration.
//
// The state lives in two bounded LRU tables, touched only by the socket
// goroutine: undecided peers (maxPeers, least recently seen dropped
// first) and decided peers (maxPeers more). A decided peer never goes back
// to the undecided table: when the decided table is full, the least
// recently seen decided peer is forgotten (counted and logged with its
// idle time) and detected afresh if it comes back, which the rules above
// make safe for workers.

const (
	defaultDetectPeers = 16384
	maxUndecided       = 64
)

// Instances is what the detection asks of the registrations (the non-GPU
// transfer module). Both are called on the socket goroutine for every
// message of a peer not decided yet, and for a decided peer's messages
// that name an instance: they must be cheap and never block for long.
type Instances interface {
	// InstanceTable is the protocol table instance id registered through.
	InstanceTable(id int64) (profile string, ok bool)
	// PeerTable is the table of a registered instance peer holds.
	PeerTable(peer []byte) (profile string, ok bool)
	// PeerDecided tells that peer's table was decided: an instance it
	// registered with a Tentative request takes that table.
	PeerDecided(peer []byte, profile string)
}

type detector struct {
	profiles []*protocol.Profile // newest first: the tie-break order
	byName   map[string]*protocol.Profile
	def      *protocol.Profile
	maxPeers int
	now      func() time.Time
	// undecided and decided are LRU lists of *peerState (front: least
	// recently seen), indexed by peers.
	undecided, decided *list.List
	peers              map[string]*list.Element
	// digits are GET_CHUNK_SIZE specs answering the size as a decimal
	// string, made once per table.
	digits map[*protocol.Spec]*protocol.Spec
	// evicted counts decided peers forgotten for a newly decided one.
	evicted int64
}

type peerState struct {
	id         string
	cands      uint64 // bit i: profiles[i] still fits everything seen
	decided    *protocol.Profile
	inDecided  bool // lives in the decided table
	last       time.Time
	seen       int
	warned     bool
	registered bool     // a registration was served to it: a worker
	prepared   uint64   // bit i: a message read as PREPARE_RETRIEVE by profiles[i]
	history    []string // evidence so far, a few entries
}

func newDetector(profiles []*protocol.Profile, def *protocol.Profile, maxPeers int) (*detector, error) {
	if len(profiles) == 0 || len(profiles) > 64 {
		return nil, fmt.Errorf("rpc: %d detection profiles, want 1 to 64", len(profiles))
	}
	if !slices.Contains(profiles, def) {
		return nil, fmt.Errorf("rpc: default profile %s is not among the detection profiles", def.Name)
	}
	if maxPeers <= 0 {
		maxPeers = defaultDetectPeers
	}
	byName := make(map[string]*protocol.Profile, len(profiles))
	for _, p := range profiles {
		byName[p.Name] = p
	}
	return &detector{profiles: profiles, byName: byName, def: def, maxPeers: maxPeers, now: time.Now,
		undecided: list.New(), decided: list.New(), peers: map[string]*list.Element{},
		digits: map[*protocol.Spec]*protocol.Spec{}}, nil
}

// size is the number of peers remembered, both tables (for tests of the bound).
func (d *detector) size() int { return d.undecided.Len() + d.decided.Len() }

// known returns peer's state, marked seen now, or nil when it has none.
func (d *detector) known(peer []byte) *peerState {
	e, ok := d.peers[string(peer)]
	if !ok {
		return nil
	}
	st := e.Value.(*peerState)
	if st.inDecided {
		d.decided.MoveToBack(e)
	} else {
		d.undecided.MoveToBack(e)
	}
	st.last = d.now()
	return st
}

// state returns peer's state, a new undecided one when it has none.
func (d *detector) state(peer []byte) *peerState {
	if st := d.known(peer); st != nil {
		return st
	}
	for d.undecided.Len() >= d.maxPeers {
		old := d.undecided.Front()
		delete(d.peers, old.Value.(*peerState).id)
		d.undecided.Remove(old)
	}
	st := &peerState{id: string(peer), cands: 1<<uint(len(d.profiles)) - 1, last: d.now()}
	if len(d.profiles) == 64 {
		st.cands = ^uint64(0)
	}
	d.peers[st.id] = d.undecided.PushBack(st)
	return st
}

// decide settles st on p and moves it to the decided table; when that is
// full the least recently seen decided peer is forgotten, and its idle
// time reported.
func (d *detector) decide(st *peerState, p *protocol.Profile) (droppedIdle time.Duration) {
	st.decided = p
	if st.inDecided {
		return 0
	}
	if d.decided.Len() >= d.maxPeers {
		old := d.decided.Front()
		ost := old.Value.(*peerState)
		droppedIdle = max(st.last.Sub(ost.last), time.Nanosecond)
		delete(d.peers, ost.id)
		d.decided.Remove(old)
		d.evicted++
	}
	d.undecided.Remove(d.peers[st.id])
	st.inDecided = true
	st.history = nil
	d.peers[st.id] = d.decided.PushBack(st)
	return droppedIdle
}

// fit is one table's reading of a message.
type fit struct {
	idx  int
	spec *protocol.Spec
	args []any
}

// route picks the profile for one message of peer (frames after the
// identity). With args decoded (ok true) the caller must not decode again.
func (s *Server) route(peer []byte, frames [][]byte) (prof *protocol.Profile, spec *protocol.Spec, args []any, decoded bool, err error) {
	d := s.detect
	if d == nil {
		spec, err = s.opts.Profile.DecodeHead(frames)
		return s.opts.Profile, spec, nil, false, err
	}
	if st := d.known(peer); st != nil && st.decided != nil {
		return s.readUnder(st.decided, frames)
	}
	if p := s.heldTable(peer); p != nil {
		st := d.state(peer)
		st.history = append(st.history, "holds an instance registered through "+p.Name)
		s.settle(st, p, false, hex.EncodeToString(peer), nil)
		return s.readUnder(p, frames)
	}
	st := d.state(peer)
	var fits []fit
	for i, p := range d.profiles {
		if st.cands&(1<<uint(i)) == 0 {
			continue
		}
		sp, err := p.DecodeHead(frames)
		if err != nil || sp.Unsupported != "" {
			// A request a table does not serve (GPU path) carries no
			// evidence: any payload "fits" it.
			continue
		}
		a, err := p.DecodePayloadLimits(sp, frames[2:], s.lim)
		if err != nil {
			continue
		}
		fits = append(fits, fit{idx: i, spec: sp, args: a})
	}
	if len(fits) == 0 {
		return d.fitsNone(frames, s.lim)
	}
	var mask uint64
	var names []string
	for _, f := range fits {
		mask |= 1 << uint(f.idx)
		names = append(names, d.profiles[f.idx].Name+":"+f.spec.Name)
	}
	st.cands = mask
	st.seen++
	for _, f := range fits {
		if f.spec.Handler == protocol.PrepareRetrieve {
			st.prepared |= 1 << uint(f.idx)
		}
	}
	if len(st.history) < 4 {
		st.history = append(st.history, fmt.Sprintf("type %s with %d payload frames fits %s",
			typeText(frames), len(frames)-2, strings.Join(names, ",")))
	}
	peerHex := hex.EncodeToString(peer)
	if f, id, ok := s.instanceFit(fits); ok {
		p := d.profiles[f.idx]
		st.history = append(st.history, fmt.Sprintf("%s:%s names instance %d, registered through %s", p.Name, f.spec.Name, id, p.Name))
		s.settle(st, p, false, peerHex, names)
		return p, f.spec, f.args, true, nil
	}
	if len(fits) == 1 {
		f := fits[0]
		s.settle(st, d.profiles[f.idx], false, peerHex, names)
		return d.profiles[f.idx], f.spec, f.args, true, nil
	}
	agree := true
	for _, f := range fits[1:] {
		if f.spec.Handler != fits[0].spec.Handler || f.spec.Unsupported != fits[0].spec.Unsupported {
			agree = false
		}
	}
	if agree {
		if fits[0].spec.Handler == protocol.RegisterKVCacheNonGPUContext {
			st.registered = true
		}
		pick := d.tieBreak(fits)
		if st.seen >= maxUndecided {
			s.settle(st, d.profiles[pick.idx], true, peerHex, names)
		}
		return d.profiles[pick.idx], pick.spec, pick.args, true, nil
	}
	pick, spec, ok := d.serveAmbiguous(fits, st)
	if !st.warned {
		st.warned = true
		served := "nothing (no reading every candidate's client decodes)"
		if ok {
			served = d.profiles[pick.idx].Name + ":" + spec.Name + " answered as " + spec.Result
		}
		if s.limiter.allow("protocol_auto_ambiguous") {
			s.log.Warn("protocol auto: ambiguous message from an undecided peer",
				"peer", peerHex, "fits", strings.Join(names, ","), "served", served)
		}
	}
	if st.seen >= maxUndecided {
		s.settle(st, d.profiles[d.tieBreak(fits).idx], true, peerHex, names)
	}
	if !ok {
		return d.profiles[fits[0].idx], fits[0].spec, nil, false, &protocol.DecodeError{Kind: protocol.KindAmbiguous,
			Spec: fits[0].spec, Err: fmt.Errorf("the peer's table is not known yet and its candidates read this message as %s", strings.Join(names, ", "))}
	}
	return d.profiles[pick.idx], spec, pick.args, true, nil
}

// tentative reports whether peer's table is still undecided once its
// message was routed (route ran for it): the message was read under one of
// several tables that read it alike.
func (s *Server) tentative(peer []byte) bool {
	if s.detect == nil {
		return false
	}
	e, ok := s.detect.peers[string(peer)]
	return !ok || e.Value.(*peerState).decided == nil
}

// readUnder reads a message of a peer whose table is p: under p, unless
// it names a registered instance that registered through another table
// and reads under that one as a request naming the same instance.
func (s *Server) readUnder(p *protocol.Profile, frames [][]byte) (*protocol.Profile, *protocol.Spec, []any, bool, error) {
	spec, err := p.DecodeHead(frames)
	if err != nil || spec.Unsupported != "" || s.opts.Instances == nil {
		return p, spec, nil, false, err
	}
	id, ok := p.NamedInstance(spec, frames[2:])
	if !ok {
		return p, spec, nil, false, nil
	}
	name, ok := s.opts.Instances.InstanceTable(id)
	q := s.detect.byName[name]
	if !ok || q == nil || q == p {
		return p, spec, nil, false, nil
	}
	qs, err := q.DecodeHead(frames)
	if err != nil || qs.Unsupported != "" {
		return p, spec, nil, false, nil
	}
	args, err := q.DecodePayloadLimits(qs, frames[2:], s.lim)
	if err != nil {
		return p, spec, nil, false, nil
	}
	if named, ok := qs.InstanceOf(args); !ok || named != id {
		return p, spec, nil, false, nil
	}
	return q, qs, args, true, nil
}

// heldTable is the table of a registered instance peer holds, nil when it
// holds none (or Options.Instances is not set).
func (s *Server) heldTable(peer []byte) *protocol.Profile {
	if s.opts.Instances == nil {
		return nil
	}
	name, ok := s.opts.Instances.PeerTable(peer)
	if !ok {
		return nil
	}
	return s.detect.byName[name]
}

// instanceFit is the reading among fits that names a registered instance
// under the very table that instance registered through, if there is one.
func (s *Server) instanceFit(fits []fit) (fit, int64, bool) {
	if s.opts.Instances == nil {
		return fit{}, 0, false
	}
	for _, f := range fits {
		id, ok := f.spec.InstanceOf(f.args)
		if !ok {
			continue
		}
		if name, ok := s.opts.Instances.InstanceTable(id); ok && name == s.detect.profiles[f.idx].Name {
			return f, id, true
		}
	}
	return fit{}, 0, false
}

// settle decides st on p, counted and logged (the logs rate-limited: a
// peer cycling identities must not write a line for each).
func (s *Server) settle(st *peerState, p *protocol.Profile, guessed bool, peerHex string, names []string) {
	d := s.detect
	evidence := strings.Join(st.history, "; ")
	idle := d.decide(st, p)
	if s.opts.Instances != nil {
		s.opts.Instances.PeerDecided([]byte(st.id), p.Name)
	}
	s.stats.detected(p.Name, guessed)
	switch {
	case guessed:
		if s.limiter.allow("protocol_auto_settled") {
			s.log.Warn("protocol auto: peer still ambiguous, settled", "peer", peerHex, "profile", p.Name,
				"fits", strings.Join(names, ","), "messages", st.seen)
		}
	case s.limiter.allow("protocol_auto_detected|" + p.Name):
		s.log.Info("protocol auto: peer's table detected", "peer", peerHex, "profile", p.Name,
			"evidence", evidence, "messages", st.seen)
	}
	if idle > 0 && s.limiter.allow("protocol_auto_evicted") {
		s.log.Warn("protocol auto: decided peers at their bound; the least recently seen one is forgotten (detected afresh if it comes back)",
			"bound", d.maxPeers, "idle", idle.Round(time.Millisecond), "evicted_total", d.evicted)
	}
}

// fitsNone handles a message no candidate of its peer reads: a GPU-path
// request is reported as unsupported, anything else as bad input of the
// default table, never served (serving it under a table the peer has
// already been told apart from would be a guess).
func (d *detector) fitsNone(frames [][]byte, lim protocol.Limits) (*protocol.Profile, *protocol.Spec, []any, bool, error) {
	spec, err := d.def.DecodeHead(frames)
	if err != nil || spec.Unsupported != "" {
		return d.def, spec, nil, false, err
	}
	if _, err := d.def.DecodePayloadLimits(spec, frames[2:], lim); err != nil {
		return d.def, spec, nil, false, err
	}
	return d.def, spec, nil, false, &protocol.DecodeError{Kind: protocol.KindUnknownType, Spec: spec,
		Err: fmt.Errorf("type %s fits none of the tables left for this peer", typeText(frames))}
}

// serveAmbiguous picks how to serve a message its peer's candidates read as
// different requests, or reports that it must go unanswered. A reading runs
// only when it is not CLEAR (a guess must never wipe the cache) and its
// reply decodes in the client of every plausible reading (ReplyDecodes);
// GET_CHUNK_SIZE may answer as a decimal string, which both int and str
// clients decode. Not plausible: CLEAR from a peer that registered, and
// COMMIT_RETRIEVE under a table that read no PREPARE_RETRIEVE from it.
func (d *detector) serveAmbiguous(fits []fit, st *peerState) (fit, *protocol.Spec, bool) {
	plausible := fits[:0:0]
	for _, f := range fits {
		switch {
		case st.registered && f.spec.Handler == protocol.Clear:
		case f.spec.Handler == protocol.CommitRetrieve && st.prepared&(1<<uint(f.idx)) == 0:
		default:
			plausible = append(plausible, f)
		}
	}
	if len(plausible) == 0 {
		plausible = fits
	}
	accepts := func(sent string) bool {
		for _, f := range plausible {
			if !protocol.ReplyDecodes(d.profiles[f.idx], f.spec, sent) {
				return false
			}
		}
		return true
	}
	order := d.order(plausible)
	for _, f := range order {
		if f.spec.Handler == protocol.Clear {
			continue
		}
		if accepts(protocol.ReplySent(d.profiles[f.idx], f.spec)) {
			return f, f.spec, true
		}
	}
	for _, f := range order {
		if f.spec.Handler == protocol.GetChunkSize && !d.profiles[f.idx].Message() && accepts(protocol.SentDigits) {
			return f, d.digitsSpec(f.spec), true
		}
	}
	return fit{}, nil, false
}

func (d *detector) digitsSpec(sp *protocol.Spec) *protocol.Spec {
	if ds, ok := d.digits[sp]; ok {
		return ds
	}
	ds := *sp
	ds.Result = protocol.ResultIntDigits
	d.digits[sp] = &ds
	return &ds
}

// order is the tie-break order: the default first when it fits, then the
// newest table.
func (d *detector) order(fits []fit) []fit {
	out := make([]fit, 0, len(fits))
	for _, f := range fits {
		if d.profiles[f.idx] == d.def {
			out = append(out, f)
		}
	}
	for _, f := range fits {
		if d.profiles[f.idx] != d.def {
			out = append(out, f)
		}
	}
	return out
}

// tieBreak is the table a peer that stays ambiguous is settled on: the
// first of order that does not read the message as CLEAR (any, if all do).
func (d *detector) tieBreak(fits []fit) fit {
	order := d.order(fits)
	for _, f := range order {
		if f.spec.Handler != protocol.Clear {
			return f
		}
	}
	return order[0]
}

// typeText is the type frame as a number for logs ("?" when undecodable).
func typeText(frames [][]byte) string {
	if len(frames) < 2 {
		return "?"
	}
	_, n, err := protocol.DecodeHeader(frames[0], frames[1])
	if err != nil {
		return "?"
	}
	return fmt.Sprint(n)
}
