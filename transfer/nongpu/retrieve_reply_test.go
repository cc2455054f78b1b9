package nongpu

import (
	"bytes"
	"testing"

	"kvdock/core/protocol"
	"kvdock/transfer/torchpickle"
)

// The handler's pre-encoded pickle reply (prepareRetrieveReply, which the
// PREPARE_RETRIEVE handler runs once its gate ticket is granted) is byte for
// byte what encoding PrepareRetrieve's response gives.
func TestPickleRetrieveHandlerReplyMatchesEncoding(t *testing.T) {
	e := newEnv(t, false, 1<<20)
	e.register(1)
	k := key(tokens(2*testChunk, 3), 0, 2*testChunk)
	if _, err := e.mod.PrepareStore(k, 1); err != nil {
		t.Fatal(err)
	}
	if ok, err := e.mod.CommitStore(k, 1, pickled(t, tensorOf(1), tensorOf(2))); !ok || err != nil {
		t.Fatalf("commit = %v, %v", ok, err)
	}
	e.lookupLock(k)
	r, err := e.mod.PrepareRetrieve(k, 1)
	if err != nil || !r.Success {
		t.Fatalf("prepare retrieve = %+v, %v", r.Success, err)
	}
	want, err := protocol.Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	e.lookupLock(k)
	h := func() (any, error) {
		return e.mod.prepareRetrieveReply(k, 1, nil, func(n int) ([]byte, error) { return make([]byte, 0, n), nil })
	}
	res, err := h()
	if err != nil {
		t.Fatal(err)
	}
	enc, ok := res.(protocol.Raw)
	if !ok {
		t.Fatalf("handler answered %T, want protocol.Raw", res)
	}
	if !bytes.Equal(enc, want) || cap(enc) != len(want) {
		t.Fatalf("pre-encoded reply differs or was reallocated (%d/%d vs %d bytes)", len(enc), cap(enc), len(want))
	}
	if _, err := torchpickle.Decode(r.Data, torchpickle.Limits{}); err != nil {
		t.Fatal(err)
	}
	// A miss (no lookup lock) answers the plain response.
	res, err = h()
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := res.(protocol.PrepareRetrieveResponse); !ok || m.Success {
		t.Fatalf("miss answered %#v", res)
	}
}
