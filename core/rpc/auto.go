package rpc

import (
	"container/list"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"kvdock/core/protocol"
)

// Protocol auto-detection (--protocol auto): each peer's table is told from
// the messages it sends. A message "fits" a table when its type number is in
// the table and its payload decodes under it in full. Candidates start as
// every table; each message keeps those it fits. One left: decided, logged
// once with the evidence, and the peer's later messages take the ordinary
// path. Several left that read the message as the same request: it is
// served and detection goes on. Several that disagree: ambiguous, served
// under the configured default when it fits, otherwise under the newest
// fitting table, but never as CLEAR when another table reads it otherwise
// (a guess must never wipe the cache); logged once per peer; detection goes
// on. A message that fits no
// candidate (GPU-path requests included: they carry no evidence) is
// handled under the default, as bad or unsupported input, and narrows
// nothing. A peer still undecided after maxUndecided messages
// is settled on that same tie-break.
//
// The state is bounded: at most maxPeers peers are remembered, least
// recently seen dropped first (a dropped peer is detected afresh), so a
// hostile peer cycling identities cannot grow it. Only the socket goroutine
// touches it.

const (
	defaultDetectPeers = 16384
	maxUndecided       = 64
)

type detector struct {
	profiles []*protocol.Profile // newest first: the tie-break order
	def      *protocol.Profile
	maxPeers int
	peers    map[string]*list.Element // of *peerState
	lru      *list.List
}

type peerState struct {
	id      string
	cands   uint64 // bit i: profiles[i] still fits everything seen
	decided *protocol.Profile
	seen    int
	warned  bool
	history []string // evidence so far, a few entries
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
	return &detector{profiles: profiles, def: def, maxPeers: maxPeers,
		peers: map[string]*list.Element{}, lru: list.New()}, nil
}

// peers is the number of peers remembered (for tests of the bound).
func (d *detector) size() int { return d.lru.Len() }

func (d *detector) state(peer []byte) *peerState {
	if e, ok := d.peers[string(peer)]; ok {
		d.lru.MoveToBack(e)
		return e.Value.(*peerState)
	}
	for d.lru.Len() >= d.maxPeers {
		old := d.lru.Front()
		delete(d.peers, old.Value.(*peerState).id)
		d.lru.Remove(old)
	}
	st := &peerState{id: string(peer), cands: 1<<uint(len(d.profiles)) - 1}
	if len(d.profiles) == 64 {
		st.cands = ^uint64(0)
	}
	d.peers[st.id] = d.lru.PushBack(st)
	return st
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
	st := d.state(peer)
	if st.decided != nil {
		spec, err = st.decided.DecodeHead(frames)
		return st.decided, spec, nil, false, err
	}
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
		// Bad input whatever the table: reported under the default.
		spec, err = d.def.DecodeHead(frames)
		return d.def, spec, nil, false, err
	}
	var mask uint64
	var names []string
	for _, f := range fits {
		mask |= 1 << uint(f.idx)
		names = append(names, d.profiles[f.idx].Name+":"+f.spec.Name)
	}
	st.cands = mask
	st.seen++
	if len(st.history) < 4 {
		st.history = append(st.history, fmt.Sprintf("type %s with %d payload frames fits %s",
			typeText(frames), len(frames)-2, strings.Join(names, ",")))
	}
	peerHex := hex.EncodeToString(peer)
	if len(fits) == 1 {
		f := fits[0]
		st.decided = d.profiles[f.idx]
		s.stats.detected(st.decided.Name, false)
		s.log.Info("protocol auto: peer's table detected", "peer", peerHex, "profile", st.decided.Name,
			"evidence", strings.Join(st.history, "; "), "messages", st.seen)
		return st.decided, f.spec, f.args, true, nil
	}
	agree := true
	for _, f := range fits[1:] {
		if f.spec.Handler != fits[0].spec.Handler || f.spec.Unsupported != fits[0].spec.Unsupported {
			agree = false
		}
	}
	pick := d.tieBreak(fits)
	if !agree && !st.warned {
		st.warned = true
		s.log.Warn("protocol auto: ambiguous message, served under the configured default when it fits, else the newest table",
			"peer", peerHex, "fits", strings.Join(names, ","), "default", d.def.Name,
			"served_as", d.profiles[pick.idx].Name+":"+pick.spec.Name)
	}
	if st.seen >= maxUndecided {
		st.decided = d.profiles[pick.idx]
		s.stats.detected(st.decided.Name, true)
		s.log.Warn("protocol auto: peer still ambiguous, settled", "peer", peerHex, "profile", st.decided.Name,
			"fits", strings.Join(names, ","), "messages", st.seen)
	}
	return d.profiles[pick.idx], pick.spec, pick.args, true, nil
}

// tieBreak picks among disagreeing fits: the default when it fits, else the
// newest table; but never a reading as CLEAR while another table reads the
// message as something else (a guess must not wipe the cache).
func (d *detector) tieBreak(fits []fit) fit {
	safe := fits[:0:0]
	for _, f := range fits {
		if f.spec.Handler != protocol.Clear {
			safe = append(safe, f)
		}
	}
	if len(safe) == 0 {
		safe = fits
	}
	for _, f := range safe {
		if d.profiles[f.idx] == d.def {
			return f
		}
	}
	return safe[0]
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
