package ctl

import (
	"testing"

	"kvdock/assets"
	"kvdock/core/protocol"
	"kvdock/settings"
)

// wireRequests are ctl's ZMQ commands.
func wireRequests() []wireRequest {
	return []wireRequest{
		{cmd: "ping", name: protocol.Ping},
		{cmd: "noop", name: protocol.Noop},
		{cmd: "chunk-size", name: protocol.GetChunkSize},
		{cmd: "clear", name: protocol.Clear},
		{cmd: "end-session", name: protocol.EndSession, params: []string{"req-1"}},
	}
}

func loadAll(t *testing.T) []*protocol.Profile {
	t.Helper()
	var all []*protocol.Profile
	for _, name := range settings.ProtocolProfiles() {
		p, err := protocol.Load(name, assets.Protocol)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, p)
	}
	return all
}

// Every ZMQ command encodes in every table as a request that table reads
// back as the same request (PING's None id, CLEAR's force included).
func TestEveryCommandInEveryTable(t *testing.T) {
	for _, p := range loadAll(t) {
		for _, r := range wireRequests() {
			c, err := requestIn(p, r)
			if err != nil {
				t.Errorf("%s %s: %v", p.Name, r.cmd, err)
				continue
			}
			frames, err := encodeRequest(c)
			if err != nil {
				t.Errorf("%s %s: %v", p.Name, r.cmd, err)
				continue
			}
			spec, args, err := p.DecodeRequest(frames)
			if err != nil || spec.Handler != r.name {
				t.Errorf("%s %s: read back as %v, %v", p.Name, r.cmd, spec, err)
				continue
			}
			if r.cmd == "end-session" && (len(args) != 1 || args[0] != "req-1") {
				t.Errorf("%s end-session: args %v", p.Name, args)
			}
		}
	}
}

// Under auto, whatever the auto default, each command goes out in a table
// no other table reads it under (the server's detection then serves it at
// once), the auto default whenever its own encoding is such.
func TestAutoSendsWhatOneTableReads(t *testing.T) {
	all := loadAll(t)
	for _, def := range settings.ProtocolProfiles() {
		tg := wireTarget{profile: settings.ProtocolAuto, autoDefault: def}
		for _, r := range wireRequests() {
			c, err := tg.call(r)
			if err != nil {
				t.Errorf("default %s, %s: %v", def, r.cmd, err)
				continue
			}
			frames, err := encodeRequest(c)
			if err != nil {
				t.Fatal(err)
			}
			if readers := tablesReading(all, frames); len(readers) != 1 || readers[0].Name != c.prof.Name {
				t.Errorf("default %s, %s: sent as %s, read by %d tables", def, r.cmd, c.prof.Name, len(readers))
			}
			own, _ := requestIn(mustProfile(t, all, def), r)
			ownFrames, _ := encodeRequest(own)
			if len(tablesReading(all, ownFrames)) == 1 && c.prof.Name != def {
				t.Errorf("default %s, %s: sent as %s though the default's own message is unambiguous", def, r.cmd, c.prof.Name)
			}
		}
	}
	// The seed's PING (type 17, no payload) is engine-driven's CLEAR and
	// nongpu-v2's GET_CHUNK_SIZE: the reason auto cannot simply speak the
	// default.
	seed, _ := requestIn(mustProfile(t, all, "nongpu-v1"), wireRequest{cmd: "ping", name: protocol.Ping})
	frames, _ := encodeRequest(seed)
	if n := len(tablesReading(all, frames)); n < 2 {
		t.Fatalf("the seed's PING is read by %d tables; the test's premise is gone", n)
	}
}

func mustProfile(t *testing.T, all []*protocol.Profile, name string) *protocol.Profile {
	t.Helper()
	for _, p := range all {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no profile %s", name)
	return nil
}
