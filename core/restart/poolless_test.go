package restart

import (
	"testing"
	"time"

	"kvdock/core/protocol"
)

// TestRecordWithoutAPool: a stop whose pool was private memory records the
// registrations alone; the record decodes with them and no pool, while a
// record with half a pool is still refused.
func TestRecordWithoutAPool(t *testing.T) {
	r := Record{Build: "test", PID: 1, Endpoint: "127.0.0.1:1", StoppedAt: time.Unix(1, 0), WrittenAt: time.Unix(2, 0),
		Registrations: []Registration{{ID: 7, Profile: "nongpu-v1", Mode: "PICKLE", Registered: time.Unix(1, 0),
			Payload: protocol.RegisterPayload{InstanceID: 7, ModelName: "m", WorldSize: 1, BlockSize: 16, NumLayers: 2,
				HiddenDimSize: 16, DtypeStr: "float32"}}}}
	data, err := Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(data)
	if err != nil {
		t.Fatalf("decode a record without a pool: %v", err)
	}
	if got.Pool.Segment.Name != "" || got.Pool.Size != 0 || len(got.Registrations) != 1 || got.Registrations[0].Payload.ModelName != "m" {
		t.Fatalf("decoded %+v", got)
	}
	r.Pool.Size = 1 << 20
	data, err = Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(data); err == nil {
		t.Fatal("a record with a pool size and no segment decoded")
	}
}
