package protocol_test

import (
	"bytes"
	"testing"

	"kvdock/core/protocol"
)

// A poll result survives its encoding: the fields msgspec's dataclasses
// carry, in declaration order, hashes as 32-byte bins, None parents.
func TestKVEventPollResultRoundTrip(t *testing.T) {
	parent := [32]byte{31: 7}
	in := protocol.KVEventPollResult{Enabled: true, Incarnation: 1 << 60, NextCursor: 9, Lost: true,
		Events: []protocol.KVEventRecord{
			{Seq: 8, Kind: "stored", Medium: "CPU", Model: "m", Hashes: [][32]byte{{1}}, Parent: &parent,
				TokenIDs: []uint32{1, 2, 70000}, BlockSize: 3},
			{Seq: 9, Kind: "removed", Medium: "CPU", Model: "m", Hashes: [][32]byte{{1}, {2}}, BlockSize: 3},
		}}
	b, err := protocol.Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"enabled", "incarnation", "next_cursor", "lost", "events", "seq", "kind",
		"medium", "model_name", "block_hashes", "parent_block_hash", "token_ids", "block_size"} {
		if !bytes.Contains(b, []byte(key)) {
			t.Fatalf("no %q in the encoding", key)
		}
	}
	out, err := protocol.DecodeKVEventPollResult(b, protocol.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if !out.Enabled || out.Incarnation != 1<<60 || out.NextCursor != 9 || !out.Lost || len(out.Events) != 2 ||
		*out.Events[0].Parent != parent || out.Events[1].Parent != nil || out.Events[0].TokenIDs[2] != 70000 ||
		out.Events[1].Hashes[1] != [32]byte{2} || out.Events[1].Kind != "removed" || out.Events[0].BlockSize != 3 {
		t.Fatalf("round trip: %+v", out)
	}
}

// TestHostileKVEventPollResult: a reply that lies about its counts, carries
// a hash of another length or lacks a field is refused before anything the
// frame could not hold is allocated.
func TestHostileKVEventPollResult(t *testing.T) {
	ok, err := protocol.Encode(protocol.KVEventPollResult{Events: []protocol.KVEventRecord{
		{Seq: 1, Kind: "removed", Hashes: [][32]byte{{1}}}}})
	if err != nil {
		t.Fatal(err)
	}
	for name, frame := range map[string][]byte{
		"truncated": ok[:len(ok)-3],
		// events: array32 of 2^31 records in a short frame.
		"records count": append(bytes.Clone(ok[:bytes.Index(ok, []byte("events"))+6]), 0xdd, 0x7f, 0xff, 0xff, 0xff),
		"short hash":    bytes.Replace(ok, append([]byte{0xc4, 32, 1}, make([]byte, 31)...), []byte{0xc4, 1, 1}, 1),
		"missing field": bytes.Replace(ok, []byte("\xa4lost\xc2"), []byte("\xa4lozt\xc2"), 1),
		"trailing":      append(bytes.Clone(ok), 0xc0),
	} {
		if _, err := protocol.DecodeKVEventPollResult(frame, protocol.DefaultLimits()); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, err := protocol.DecodeKVEventPollResult(ok, protocol.DefaultLimits()); err != nil {
		t.Fatalf("the valid frame: %v", err)
	}
}
