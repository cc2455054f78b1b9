package ctl

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"kvdock/assets"
	"kvdock/core/protocol"
	"kvdock/settings"
)

// wireRequest is one of ctl's ZMQ commands: the canonical request and the
// operator's arguments (end-session's request id).
type wireRequest struct {
	cmd    string // ctl's name: "ping"
	name   string // canonical request: protocol.Ping
	params []string
}

// args are the request's payload in the shape spec gives it: the
// operator's arguments for its strings, and upstream's defaults for what
// ctl has no value for: None for PING's instance id (an untracked prober,
// which no reaper counts as a worker) and false for CLEAR's force.
func (r wireRequest) args(spec *protocol.Spec, profile string) ([]any, error) {
	var out []any
	params := r.params
	for _, typ := range spec.Payload {
		switch typ {
		case protocol.TypeOptInt:
			out = append(out, nil)
		case protocol.TypeBool:
			out = append(out, false)
		case protocol.TypeStr:
			if len(params) == 0 {
				return nil, fmt.Errorf("%s of profile %s takes a string kvdock ctl was not given", spec.Name, profile)
			}
			out = append(out, params[0])
			params = params[1:]
		default:
			return nil, fmt.Errorf("%s of profile %s takes [%s], which kvdock ctl does not send", spec.Name, profile, strings.Join(spec.Payload, ", "))
		}
	}
	return out, nil
}

// wireCall is a request as it goes out: the table, the spec and the args.
type wireCall struct {
	prof *protocol.Profile
	spec *protocol.Spec
	args []any
}

// wireTarget is the table ctl speaks to the server: one profile, or under
// auto the server's detection, reached with the auto default where it can
// be. How says where ctl learnt it ("from --protocol", "from the server's
// /status"), for the messages.
type wireTarget struct {
	profile     string // a profile name, or settings.ProtocolAuto
	autoDefault string
	how         string
}

// targetOf is the table of cfg, whose server.protocol came from src. Left
// at its default by every layer, it is what the server's /status says it
// speaks, when the HTTP API answers for the ZMQ endpoint ctl dials: a
// plain `kvdock ctl ping` so reaches a server started with --protocol X or
// auto. Otherwise the settings' value.
func targetOf(cfg settings.Config, src settings.Source, timeout time.Duration) wireTarget {
	t := wireTarget{profile: cfg.Server.Protocol, autoDefault: cfg.Server.ProtocolAutoDefault, how: "from " + src.String()}
	if src.Kind != settings.SourceDefault {
		return t
	}
	if s, ok := serverProtocol(cfg, min(timeout, discoverWait)); ok {
		return wireTarget{profile: s.Protocol, autoDefault: s.ProtocolDetection.Default, how: "from the server's /status"}
	}
	t.how = "the default; the server's /status did not say"
	return t
}

// discoverWait bounds the /status read that finds the server's table.
const discoverWait = 2 * time.Second

// protocolStatus is the part of /status that names the server's table.
type protocolStatus struct {
	Endpoint          string `json:"endpoint"`
	Protocol          string `json:"protocol"`
	ProtocolDetection struct {
		Default string `json:"default"`
	} `json:"protocol_detection"`
}

// serverProtocol reads the table of the kvdock whose HTTP API cfg names,
// if it serves the ZMQ port ctl dials (another kvdock's answer says
// nothing of this one) and names tables ctl knows.
func serverProtocol(cfg settings.Config, timeout time.Duration) (protocolStatus, bool) {
	var s protocolStatus
	if cfg.HTTP.Port <= 0 || cfg.HTTP.Port > 65535 {
		return s, false
	}
	body, err := statusFetch("http://"+settings.DialAddr(cfg.HTTP.Host, cfg.HTTP.Port)+"/status", timeout)
	if err != nil || json.Unmarshal(body, &s) != nil {
		return s, false
	}
	i := strings.LastIndexByte(s.Endpoint, ':')
	if port, err := strconv.Atoi(s.Endpoint[i+1:]); i < 0 || err != nil || port != cfg.Server.Port {
		return s, false
	}
	known := settings.ProtocolProfiles()
	if !slices.Contains(known, s.Protocol) && !(s.Protocol == settings.ProtocolAuto && slices.Contains(known, s.ProtocolDetection.Default)) {
		return s, false
	}
	return s, true
}

// call is r as t's server reads it. Under auto it is r in the first table,
// the auto default first and then the newest, whose encoding of r no other
// table reads: the server's detection then knows ctl's table from this one
// message and serves it, where a message two tables read differently (the
// seed's PING is engine-driven's CLEAR) would go unanswered.
func (t wireTarget) call(r wireRequest) (wireCall, error) {
	if t.profile != settings.ProtocolAuto {
		p, err := protocol.Load(t.profile, assets.Protocol)
		if err != nil {
			return wireCall{}, err
		}
		return requestIn(p, r)
	}
	order := []string{t.autoDefault}
	for _, name := range slices.Backward(settings.ProtocolProfiles()) {
		if name != t.autoDefault {
			order = append(order, name)
		}
	}
	all := make([]*protocol.Profile, 0, len(order))
	for _, name := range order {
		p, err := protocol.Load(name, assets.Protocol)
		if err != nil {
			return wireCall{}, err
		}
		all = append(all, p)
	}
	for _, p := range all {
		c, err := requestIn(p, r)
		if err != nil {
			continue
		}
		frames, err := encodeRequest(c)
		if err != nil {
			continue
		}
		if readers := tablesReading(all, frames); len(readers) == 1 && readers[0] == p {
			return c, nil
		}
	}
	return wireCall{}, fmt.Errorf("no protocol table sends %s so that --protocol auto can tell which table it is", r.cmd)
}

// requestIn is r under p.
func requestIn(p *protocol.Profile, r wireRequest) (wireCall, error) {
	spec, ok := p.ByName(r.name)
	if !ok {
		return wireCall{}, fmt.Errorf("profile %s has no %s request", p.Name, r.name)
	}
	args, err := r.args(spec, p.Name)
	if err != nil {
		return wireCall{}, err
	}
	return wireCall{prof: p, spec: spec, args: args}, nil
}

// encodeRequest is c's frames after the identity, as the client sends them
// (uid, type, payload).
func encodeRequest(c wireCall) ([][]byte, error) {
	uid, err := protocol.Encode(int64(0))
	if err != nil {
		return nil, err
	}
	typ, err := protocol.Encode(c.spec.Number)
	if err != nil {
		return nil, err
	}
	frames := [][]byte{uid, typ}
	if c.prof.Message() {
		msg, err := protocol.EncodeMessage(c.spec, c.args...)
		return append(frames, msg), err
	}
	for _, a := range c.args {
		b, err := protocol.Encode(a)
		if err != nil {
			return nil, err
		}
		frames = append(frames, b)
	}
	return frames, nil
}

// tablesReading lists the tables that read frames as a request they serve
// (the "fit" of the server's detection).
func tablesReading(all []*protocol.Profile, frames [][]byte) []*protocol.Profile {
	var out []*protocol.Profile
	for _, p := range all {
		spec, err := p.DecodeHead(frames)
		if err != nil || spec.Unsupported != "" {
			continue
		}
		if _, err := p.DecodePayload(spec, frames[2:]); err == nil {
			out = append(out, p)
		}
	}
	return out
}
