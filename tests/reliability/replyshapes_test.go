package reliability

import (
	"testing"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"

	"kvdock/tests/harness"
)

// TestReplyShapesDecodeThroughProtocol: the reply shapes tests decode with
// client.Reply.Decode go through the protocol decoders.
func TestReplyShapesDecodeThroughProtocol(t *testing.T) {
	s := protocol.Slot{Offset: 4096, Length: 4096, Shape: []int{2, 2, 16, 16}, Dtype: "float32"}
	raw, err := protocol.Encode(protocol.PrepareStoreResponse{Shm: true, Slots: []protocol.Slot{s}, ChunkIndices: []int{1}})
	if err != nil {
		t.Fatal(err)
	}
	var ps harness.PrepStore
	if err := (client.Reply{Present: true, Raw: raw}).Decode(&ps); err != nil || len(ps.Context.Slots) != 1 || ps.Context.Slots[0].Offset != 4096 || ps.Context.ChunkIndices[0] != 1 {
		t.Fatalf("prepare_store: %+v %v", ps, err)
	}
	raw, err = protocol.Encode(protocol.PrepareRetrieveResponse{Success: true, Data: []byte("x"), Slots: []protocol.Slot{s}})
	if err != nil {
		t.Fatal(err)
	}
	var pr harness.PrepRetrieve
	if err := (client.Reply{Present: true, Raw: raw}).Decode(&pr); err != nil || !pr.Success || string(pr.Data) != "x" || len(pr.Context.Slots) != 1 {
		t.Fatalf("prepare_retrieve: %+v %v", pr, err)
	}
	// A slot the protocol refuses fails the decode.
	bad := []byte{0x81, 0xa7, 'c', 'o', 'n', 't', 'e', 'x', 't', 0x81, 0xa5, 's', 'l', 'o', 't', 's', 0x91, 0x80}
	if err := (client.Reply{Present: true, Raw: bad}).Decode(&ps); err == nil {
		t.Fatal("a slot without fields decoded")
	}
}
