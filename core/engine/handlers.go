package engine

import (
	"context"
	"fmt"
	"time"

	"kvdock/core/keys"
	"kvdock/core/kvevents"
	"kvdock/core/lookup"
	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/settings"
)

// keyRequest turns a wire key into the session request of core/keys.
func keyRequest(k protocol.Key) keys.KeyRequest {
	return keys.KeyRequest{
		RequestID: k.RequestID, Model: k.ModelName, WorldSize: k.WorldSize, Worker: k.WorkerID,
		Tokens: k.TokenIDs, Start: k.Start, End: k.End, Salt: k.CacheSalt,
	}
}

// keyAndInt reads the [key, int] payload of LOOKUP and FREE_LOOKUP_LOCKS.
func keyAndInt(req *rpc.Request) (protocol.Key, int, error) {
	if err := req.Arity(2); err != nil {
		return protocol.Key{}, 0, err
	}
	k, err := req.Key(0)
	if err != nil {
		return protocol.Key{}, 0, err
	}
	n, err := req.Int(1)
	if err != nil {
		return protocol.Key{}, 0, err
	}
	return k, int(n), nil
}

// requestID reads the [request_id] payload of the prefetch queries and END_SESSION.
func requestID(req *rpc.Request) (string, error) {
	if err := req.Arity(1); err != nil {
		return "", err
	}
	return req.Str(0)
}

// waitArgs reads WAIT_PREFETCH_STATUS [request_id, timeout seconds].
func waitArgs(req *rpc.Request) (string, time.Duration, error) {
	if err := req.Arity(2); err != nil {
		return "", 0, err
	}
	id, err := req.Str(0)
	if err != nil {
		return "", 0, err
	}
	secs, ok := req.Args[1].(float64)
	if !ok {
		return "", 0, fmt.Errorf("%s: timeout is %T, want a float", req.Name, req.Args[1])
	}
	// Decoding refused NaN and the infinities; cap before converting so a
	// huge value cannot overflow the Duration.
	secs = min(max(secs, 0), lookup.MaxWait.Seconds())
	return id, time.Duration(secs * float64(time.Second)), nil
}

// handlers are the lookup and management modules (the transfer module brings
// its own), by canonical request name.
// polls names the tables of this start that serve POLL_KV_EVENTS.
func (e *Engine) handlers(cfg settings.Config, p *dataPlane, polls map[string]bool) map[string]rpc.Handler {
	chunk := int64(cfg.Server.ChunkSize)
	h := map[string]rpc.Handler{
		protocol.Lookup: func(_ context.Context, req *rpc.Request) (any, error) {
			k, tp, err := keyAndInt(req)
			if err != nil {
				return nil, err
			}
			return nil, p.lookup.LookupFrom(string(req.Peer), keyRequest(k), tp)
		},
		protocol.QueryPrefetchStatus: func(_ context.Context, req *rpc.Request) (any, error) {
			id, err := requestID(req)
			if err != nil {
				return nil, err
			}
			hits, done := p.lookup.QueryStatus(id)
			if !done {
				return nil, nil // still running: no result frame, as upstream
			}
			return int64(hits), nil
		},
		protocol.WaitPrefetchStatus: func(ctx context.Context, req *rpc.Request) (any, error) {
			id, timeout, err := waitArgs(req)
			if err != nil {
				return nil, err
			}
			// Runs on the shared pool (profile class shared), never on the
			// socket goroutine; the wait is capped by lookup.MaxWait.
			hits, done := p.lookup.WaitStatus(ctx, id, timeout)
			if !done {
				return nil, nil // timed out: None, as upstream
			}
			return int64(hits), nil
		},
		protocol.QueryPrefetchLookupHits: func(_ context.Context, req *rpc.Request) (any, error) {
			id, err := requestID(req)
			if err != nil {
				return nil, err
			}
			hits, done := p.lookup.QueryHits(id)
			if !done {
				return nil, nil
			}
			return int64(hits), nil
		},
		protocol.FreeLookupLocks: func(_ context.Context, req *rpc.Request) (any, error) {
			k, tp, err := keyAndInt(req)
			if err != nil {
				return nil, err
			}
			return nil, p.lookup.FreeLocks(keyRequest(k), tp)
		},
		protocol.EndSession: func(_ context.Context, req *rpc.Request) (any, error) {
			id, err := requestID(req)
			if err != nil {
				return nil, err
			}
			p.lookup.EndSession(id)
			return nil, nil
		},
		protocol.GetChunkSize: func(context.Context, *rpc.Request) (any, error) { return chunk, nil },
		protocol.Noop:         func(context.Context, *rpc.Request) (any, error) { return "OK", nil },
		// No experimental intermediate-tensor transfer is served (the empty
		// list upstream answers when none is enabled, controller.py @
		// 08c7d2fa); the poll channel is named to peers of a table that
		// serves POLL_KV_EVENTS, and only once the peer's table is known: a
		// worker that polls a table without it would wait for answers that
		// never come.
		protocol.GetExperimental: func(_ context.Context, req *rpc.Request) (any, error) {
			if p.kvLog != nil && req.Spec != nil && polls[req.Spec.Profile] && !req.Tentative {
				return []string{kvevents.Capability}, nil
			}
			return []string{}, nil
		},
		protocol.PollKVEvents: func(_ context.Context, req *rpc.Request) (any, error) {
			return pollKVEvents(p.kvLog, req)
		},
		protocol.Ping: func(_ context.Context, req *rpc.Request) (any, error) {
			return ping(p, req)
		},
		protocol.Clear: func(_ context.Context, req *rpc.Request) (any, error) {
			// [] or [force] (engine-driven controller.py @ 08c7d2fa, PR #5158).
			// Either way the same clear: unlocked objects go, locked ones are
			// doomed (unreadable at once, freed when their holder ends), so
			// force never frees bytes a transfer is still using.
			if len(req.Args) > 1 {
				return nil, fmt.Errorf("CLEAR: %d arguments, want [] or [force]", len(req.Args))
			}
			if len(req.Args) == 1 {
				if _, ok := req.Args[0].(bool); !ok {
					return nil, fmt.Errorf("CLEAR: force is %T, want a bool", req.Args[0])
				}
			}
			e.clearDataPlane(p, ClearByWorker)
			return nil, nil
		},
		// Observability only upstream; the server's request stats count it.
		protocol.ReportBlockAllocation: func(context.Context, *rpc.Request) (any, error) { return nil, nil },
	}
	for name, fn := range p.transfer.Handlers() {
		h[name] = fn
	}
	for name, fn := range h {
		h[name] = p.guard(fn)
	}
	return h
}

// ping answers PING: no payload (seed eras) or [instance_id | None] (the
// engine-driven era and later). An id marks that registered instance alive
// for the reaper; None (an untracked prober such as a scheduler) and ids
// nobody registered change nothing, so a flood of made-up ids keeps no
// state. The answer is always true, as upstream's.
func ping(p *dataPlane, req *rpc.Request) (any, error) {
	switch len(req.Args) {
	case 0:
		return true, nil
	case 1:
		id, present, err := req.OptInt(0)
		if err != nil {
			return nil, err
		}
		if present {
			p.transfer.Touch(id, req.Peer)
		}
		return true, nil
	}
	return nil, req.Arity(1)
}

// pollTables names the tables among profile and detect (--protocol auto)
// that serve POLL_KV_EVENTS.
func pollTables(profile *protocol.Profile, detect []*protocol.Profile) map[string]bool {
	out := map[string]bool{}
	for _, p := range append([]*protocol.Profile{profile}, detect...) {
		if _, ok := p.ByName(protocol.PollKVEvents); ok {
			out[p.Name] = true
		}
	}
	return out
}

// pollKVEvents answers POLL_KV_EVENTS [model_name, cursor, max_events]
// (protocols/kv_events.py @ 593e6c13): the log's records of model_name
// after cursor. A negative cursor or a max_events below 1 is refused, as
// upstream's ValueError; a larger max_events than kvevents.MaxPollEvents is
// clipped. With the log off the answer is enabled=false, on which
// upstream's poller stops for good.
func pollKVEvents(log *kvevents.Log, req *rpc.Request) (any, error) {
	if err := req.Arity(3); err != nil {
		return nil, err
	}
	model, err := req.Str(0)
	if err != nil {
		return nil, err
	}
	cursor, err := req.Int(1)
	if err != nil {
		return nil, err
	}
	maxEvents, err := req.Int(2)
	if err != nil {
		return nil, err
	}
	if cursor < 0 {
		return nil, fmt.Errorf("%s: cursor %d, want >= 0", req.Name, cursor)
	}
	if maxEvents < 1 {
		return nil, fmt.Errorf("%s: max_events %d, want >= 1", req.Name, maxEvents)
	}
	out := protocol.KVEventPollResult{Events: []protocol.KVEventRecord{}}
	if log == nil {
		return out, nil
	}
	r := log.Read(uint64(cursor), model, int(min(maxEvents, kvevents.MaxPollEvents)))
	out.Enabled, out.Incarnation, out.NextCursor, out.Lost = true, r.Incarnation, int64(r.NextCursor), r.Lost
	for _, e := range r.Events {
		rec := protocol.KVEventRecord{Seq: int64(e.Seq), Kind: "removed", Medium: e.Medium, Model: e.Model,
			Hashes: make([][32]byte, len(e.Hashes)), BlockSize: int64(log.BlockSize())}
		for i, h := range e.Hashes {
			rec.Hashes[i] = h
		}
		if e.Stored {
			rec.Kind, rec.TokenIDs = "stored", e.Tokens
			if e.HasParent {
				parent := [32]byte(e.Parent)
				rec.Parent = &parent
			}
		}
		out.Events = append(out.Events, rec)
	}
	return out, nil
}
