package engine

import (
	"github.com/valkey-io/valkey-go"

	"kvdock/core/rpc"
	"kvdock/settings"
	"kvdock/transfer/tier"
	"kvdock/transfer/tier/resp"
)

// What the faces need of the wire server and the tiers, named here so that
// they read the engine's types and never import the modules it wires.

// Observer sees every request's outcome and latency (the metrics face is
// one).
type Observer = rpc.Observer

// The outcomes an Observer is told.
const (
	OutcomeOK      = rpc.OutcomeOK
	OutcomeError   = rpc.OutcomeError
	OutcomeDropped = rpc.OutcomeDropped
)

// TierWorkers is the write-behind writers the engine runs per L2 tier.
const TierWorkers = tier.DefaultWorkersPerTier

// RESPClientOption is the valkey-go option for a validated resp adapter with
// the tier's addresses, credentials, TLS and mode (no client-side cache),
// for a reference client on the same server as the tier.
func RESPClientOption(a settings.RESPAdapter) (valkey.ClientOption, error) {
	c := resp.FromAdapter(a)
	opt := valkey.ClientOption{InitAddress: c.Seeds(), ForceSingleClient: !c.Cluster, DisableCache: true,
		Username: c.Username, Password: c.Password}
	tc, err := c.TLSConfig()
	if err != nil {
		return opt, err
	}
	opt.TLSConfig = tc
	return opt, nil
}
