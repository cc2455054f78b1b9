package protocol_test

import (
	"bytes"
	"testing"

	"kvdock/core/protocol"
)

// TestReplyDecodesAsUpstreamClients: the reply kinds each frames-era
// client decodes, and the chunk size sent as a decimal string.
func TestReplyDecodesAsUpstreamClients(t *testing.T) {
	p := loadProfile(t, "engine-driven")
	spec := func(name string) *protocol.Spec {
		s, ok := p.ByName(name)
		if !ok {
			t.Fatalf("no %s", name)
		}
		return s
	}
	for _, c := range []struct {
		req, sent string
		want      bool
	}{
		{protocol.Clear, protocol.SentNone, true},
		{protocol.Clear, protocol.ResultInt, false},
		{protocol.GetChunkSize, protocol.ResultInt, true},
		{protocol.GetChunkSize, protocol.SentDigits, true},
		{protocol.GetChunkSize, protocol.ResultBool, false},
		{protocol.GetChunkSize, protocol.ResultStr, false},
		{protocol.Noop, protocol.SentDigits, true},
		{protocol.Noop, protocol.ResultInt, false},
		{protocol.Ping, protocol.ResultStr, true},
		{protocol.Ping, protocol.ResultInt, true},
		{protocol.PrepareRetrieve, protocol.ResultBool, false},
		{protocol.CommitRetrieve, protocol.ResultPrepareRetrieve, false},
	} {
		if got := protocol.ReplyDecodes(p, spec(c.req), c.sent); got != c.want {
			t.Errorf("%s client, %s reply: decodes %v, want %v", c.req, c.sent, got, c.want)
		}
	}
	ds := *spec(protocol.GetChunkSize)
	ds.Result = protocol.ResultIntDigits
	b, has, err := p.ReplyFrame(&ds, int64(256))
	want, _ := protocol.Encode("256")
	if err != nil || !has || !bytes.Equal(b, want) {
		t.Errorf("digits reply %x %v %v, want %x", b, has, err, want)
	}
	if _, _, err := p.ReplyFrame(&ds, "x"); err == nil {
		t.Errorf("digits reply of a string encoded")
	}
}
