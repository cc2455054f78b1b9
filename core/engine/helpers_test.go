package engine

import (
	"context"
	"net"
	"testing"

	"kvdock/core/rpc/client"
	"kvdock/settings"
	"kvdock/transfer/worker"
)

// startDialed starts a test engine and dials its wire server: the set-up
// most engine tests begin with.
func startDialed(t *testing.T) (*Engine, settings.Config, *client.Client) {
	t.Helper()
	cfg, _ := testConfig(t)
	e := startEngine(t, cfg)
	return e, cfg, dial(t, cfg.Server.Port, cfg.Server.Protocol)
}

// newWorker registers a one-layer float32 pickle worker for model over c and
// closes it when the test ends.
func newWorker(t *testing.T, c *client.Client, id int64, model string) *worker.Worker {
	t.Helper()
	w, err := worker.Register(context.Background(), c, worker.Config{InstanceID: id, Model: model, Layers: 1, Hidden: 32, Dtype: "float32", Pickle: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// busyPort is a 127.0.0.1 port held by a listener until the test ends, for
// an apply that must fail to bind.
func busyPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

// seqTokens is the prompt 1, 2, …, n.
func seqTokens(n int) []uint32 {
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	return toks
}
