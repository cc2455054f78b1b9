package interop

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/core/testkit/httpjson"
	"kvdock/tests/harness"
)

const oversizedLimit = 1 << 20

// wireConfig is what py/wire_client.py needs to know about the profile.
func wireConfig(t *testing.T, p *protocol.Profile, chunkSize int, oversized int) string {
	t.Helper()
	types := map[string]int64{}
	for _, s := range p.Requests {
		types[s.Handler] = s.Number // canonical names, as the script uses them
		types[s.Name] = s.Number
	}
	b, err := json.Marshal(map[string]any{"types": types, "chunk_size": chunkSize, "oversized": oversized})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type wireResult struct {
	Scenario string `json:"scenario"`
	Steps    []any  `json:"steps"`
	// Answered counts the replies the script received by type number.
	Answered map[string]int64 `json:"answered"`
}

// checkAnswered compares the server's OK count of every request type with
// the replies the scripts received (summed over results): a reply the
// server did not count, or a count without a reply, is an error.
func checkAnswered(t *testing.T, p *protocol.Profile, ok map[string]int64, results ...wireResult) {
	t.Helper()
	want := map[string]int64{}
	for _, r := range results {
		if len(r.Answered) == 0 {
			t.Fatalf("%s: the script reported no replies", r.Scenario)
		}
		for num, n := range r.Answered {
			want[num] += n
		}
	}
	for _, s := range p.Requests {
		num := strconv.FormatInt(s.Number, 10)
		if ok[s.Name] != want[num] {
			t.Errorf("%s (%s) counted OK %d times; the scripts got %d replies", s.Name, num, ok[s.Name], want[num])
		}
		delete(want, num)
	}
	if len(want) != 0 {
		t.Errorf("replies of types outside the profile: %v", want)
	}
}

// okCounts are an in-process server's OK outcomes by request name.
func okCounts(st rpc.Stats) map[string]int64 {
	ok := map[string]int64{}
	for name, r := range st.Requests {
		ok[name] = r.OK
	}
	return ok
}

func runWire(t *testing.T, endpoint, scenario, cfg string) wireResult {
	t.Helper()
	out := harness.RunPython(t, 60*time.Second, "py/wire_client.py", endpoint, scenario, cfg)
	var res wireResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &res); err != nil {
		t.Fatalf("wire_client output %q: %v", out, err)
	}
	return res
}

// inProcess serves the management requests from an in-process rpc.Server,
// so the counters can be read directly.
func inProcess(t *testing.T, profile string) *rpc.Server {
	t.Helper()
	srv, err := rpc.New(rpc.Options{Host: "localhost", Profile: harness.Profile(t, profile),
		MaxMessageBytes: oversizedLimit, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv.Handle(protocol.Noop, func(context.Context, *rpc.Request) (any, error) { return "OK", nil })
	srv.Handle(protocol.GetChunkSize, func(context.Context, *rpc.Request) (any, error) { return 256, nil })
	srv.Handle(protocol.Ping, func(context.Context, *rpc.Request) (any, error) { return true, nil })
	srv.Handle(protocol.Clear, func(context.Context, *rpc.Request) (any, error) { return nil, nil })
	srv.Handle(protocol.EndSession, func(context.Context, *rpc.Request) (any, error) { return nil, nil })
	// Bound before Serve runs: the endpoint is known on return.
	if err := srv.Bind(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return srv
}

func TestWireBasicInProcess(t *testing.T) {
	for _, name := range []string{"nongpu-v1", "nongpu-v2", "engine-driven"} {
		t.Run(name, func(t *testing.T) {
			srv := inProcess(t, name)
			res := runWire(t, srv.Endpoint(), "basic", wireConfig(t, srv.Profile(), 256, 0))
			if len(res.Steps) != 7 {
				t.Fatalf("steps %v", res.Steps)
			}
			st := srv.Stats()
			checkAnswered(t, srv.Profile(), okCounts(st), res)
			if len(st.BadInput) != 0 {
				t.Errorf("bad input on a clean run: %v", st.BadInput)
			}
		})
	}
}

func TestWireBadInputInProcess(t *testing.T) {
	srv := inProcess(t, "nongpu-v1")
	res := runWire(t, srv.Endpoint(), "badinput", wireConfig(t, srv.Profile(), 256, oversizedLimit))
	if len(res.Steps) != 9 {
		t.Fatalf("steps %v", res.Steps)
	}
	st := srv.Stats()
	want := map[string]int64{
		protocol.KindShort:           1,
		protocol.KindBadHeader:       1,
		protocol.KindUnknownType:     1,
		protocol.KindArity:           1,
		protocol.KindPayload:         2, // non_msgpack, wrong_type_payload
		protocol.KindCUDAUnsupported: 1,
		protocol.KindOversized:       1,
	}
	for kind, n := range want {
		if st.BadInput[kind] != n {
			t.Errorf("bad input %s = %d, want %d (all: %v)", kind, st.BadInput[kind], n, st.BadInput)
		}
	}
	if st.Disconnects < 1 {
		t.Errorf("the frame over ZMQ_MAXMSGSIZE did not show as a disconnect: %+v", st)
	}
	if st.DecodeFailures["NOOP"] != 1 || st.DecodeFailures["END_SESSION"] != 1 || st.DecodeFailures["LOOKUP"] != 1 {
		t.Errorf("decode failures %v", st.DecodeFailures)
	}
	checkAnswered(t, srv.Profile(), okCounts(st), res)
}

// binaryStatus reads the request counters of a running kvdock from /status:
// bad input by kind, decode failures and OK outcomes by request name.
func binaryStatus(t *testing.T, srv *harness.Server) (badInput, decodeFailures, ok map[string]int64) {
	t.Helper()
	var st struct {
		Requests struct {
			BadInput       map[string]int64 `json:"bad_input"`
			DecodeFailures map[string]int64 `json:"decode_failures"`
			ByType         map[string]struct {
				OK int64 `json:"ok"`
			} `json:"by_type"`
		} `json:"requests"`
	}
	httpjson.Get(t, srv.StatusURL(), &st)
	ok = map[string]int64{}
	for name, c := range st.Requests.ByType {
		ok[name] = c.OK
	}
	return st.Requests.BadInput, st.Requests.DecodeFailures, ok
}

// The real binary: the same scenarios; its counters come from /status.
func TestWireBinary(t *testing.T) {
	srv := harness.Start(t, "--shm-name", "", "--max-message-bytes", "1048576")
	p := harness.Profile(t, "nongpu-v1")
	cfg := wireConfig(t, p, 256, oversizedLimit)
	// The harness's readiness NOOPs count too: compare what the scripts add.
	_, _, okBefore := binaryStatus(t, srv)
	basic := runWire(t, srv.Endpoint, "basic", cfg)
	if len(basic.Steps) != 7 {
		t.Fatalf("basic steps %v", basic.Steps)
	}
	badin := runWire(t, srv.Endpoint, "badinput", cfg)
	if len(badin.Steps) != 9 {
		t.Fatalf("badinput steps %v", badin.Steps)
	}
	bad, decode, ok := binaryStatus(t, srv)
	for name, n := range okBefore {
		ok[name] -= n
	}
	checkAnswered(t, p, ok, basic, badin)
	for kind, n := range map[string]int64{
		protocol.KindShort: 1, protocol.KindBadHeader: 1, protocol.KindUnknownType: 1, protocol.KindArity: 1,
		protocol.KindPayload: 2, protocol.KindCUDAUnsupported: 1, protocol.KindOversized: 1,
	} {
		if bad[kind] != n {
			t.Errorf("kvdock /status bad_input %s = %d, want %d (all: %v)", kind, bad[kind], n, bad)
		}
	}
	if decode["NOOP"] != 1 || decode["END_SESSION"] != 1 || decode["LOOKUP"] != 1 {
		t.Errorf("kvdock /status decode_failures %v", decode)
	}
	out := srv.Output()
	if !strings.Contains(out, "protocol mismatch suspected (profile nongpu-v1, type 19 decoded as NOOP failed") {
		t.Errorf("server log lacks the protocol-mismatch warning:\n%s", out)
	}
}

func TestWireBinaryEngineDrivenProfile(t *testing.T) {
	srv := harness.Start(t, "--shm-name", "", "--protocol", "engine-driven", "--chunk-size", "64")
	cfg := wireConfig(t, harness.Profile(t, "engine-driven"), 64, 0)
	if res := runWire(t, srv.Endpoint, "basic", cfg); len(res.Steps) != 7 {
		t.Fatalf("basic steps %v", res.Steps)
	}
}
