package nongpu

import (
	"context"
	"errors"
	"fmt"

	"kvdock/core/protocol"
	"kvdock/core/rpc"
)

// Handlers returns the module's request handlers keyed by canonical name.
// Each checks its arguments' count and types and returns an error (counted
// and logged by the server, no reply in seed profiles) on bad input. A
// transfer request naming an instance that is not registered is answered
// with the request's failure reply (notRegistered), never left unanswered.
// Unregister answers nothing (nil result), refused or not.
func (m *Module) Handlers() map[string]rpc.Handler {
	unregister := func(_ context.Context, req *rpc.Request) (any, error) {
		if err := req.Arity(1); err != nil {
			return nil, err
		}
		id, err := req.Int(0)
		if err != nil {
			return nil, err
		}
		m.UnregisterFrom(id, req.Peer)
		return nil, nil
	}
	return map[string]rpc.Handler{
		protocol.RegisterKVCacheNonGPUContext: m.reporting(func(_ context.Context, req *rpc.Request) (any, error) {
			if err := req.Arity(1); err != nil {
				return nil, err
			}
			p, err := req.Register(0)
			if err != nil {
				return nil, err
			}
			// Read under a tie-break, the table is not known yet: the
			// peer's decision gives it (PeerDecided).
			profile := ""
			if req.Spec != nil && !req.Tentative {
				profile = req.Spec.Profile
			}
			return m.RegisterThrough(p, req.Peer, profile)
		}),
		protocol.UnregisterKVCache:              m.reporting(unregister),
		protocol.UnregisterKVCacheNonGPUContext: m.reporting(unregister),
		protocol.PrepareStore: m.reporting(m.notRegistered(protocol.PrepareStoreResponse{}, func(_ context.Context, req *rpc.Request) (any, error) {
			k, id, err := keyAndInstance(req, 2)
			if err != nil {
				return nil, err
			}
			defer m.begin(id, req.Peer)()
			resp, err := m.prepareStore(k, id, req.Peer)
			if n, ok := m.pickleStoreBytes(k, id); ok && err == nil {
				// Answered once its chunks fit the in-flight pickle bytes: the
				// worker sends them only after this reply.
				later := req.Defer()
				m.gate.acquire(id, n, func() { later.Answer(resp, nil) })
				return nil, nil
			}
			return resp, err
		})),
		protocol.CommitStore: m.reporting(m.notRegistered(false, func(_ context.Context, req *rpc.Request) (any, error) {
			k, id, err := keyAndInstance(req, 3)
			if err != nil {
				return nil, err
			}
			data, err := req.Bytes(2)
			if err != nil {
				return nil, err
			}
			defer m.begin(id, req.Peer)()
			if len(data) > 0 {
				// The bytes its prepare was admitted for are stored (or
				// refused) once this returns.
				defer m.gate.committed(id)
			}
			return m.commitStore(k, id, data, req.Peer)
		})),
		protocol.CommitStoreGroup: m.reporting(m.notRegistered(false, func(_ context.Context, req *rpc.Request) (any, error) {
			k, id, err := keyAndInstance(req, 4)
			if err != nil {
				return nil, err
			}
			group, err := req.Int(2)
			if err != nil {
				return nil, err
			}
			data, err := req.Bytes(3)
			if err != nil {
				return nil, err
			}
			defer m.begin(id, req.Peer)()
			return m.commitStoreGroup(k, id, group, data, req.Peer)
		})),
		protocol.PrepareRetrieve: m.reporting(m.notRegistered(protocol.PrepareRetrieveResponse{}, func(_ context.Context, req *rpc.Request) (any, error) {
			k, id, err := keyAndInstance(req, 2)
			if err != nil {
				return nil, err
			}
			if n, ok := m.retrieveReplyBytes(k, id); ok {
				// Prepared and answered once its reply fits the in-flight
				// pickle bytes; the ticket comes back when libzmq has
				// written the reply. The key's tokens are the request's
				// own (decoded, not a view of the frame), so it outlives
				// the handler.
				later := req.Defer()
				end := m.begin(id, req.Peer)
				name, peer := req.Name, string(req.Peer) // the frames end with the handler
				m.gate.acquireRetrieve(id, n+retrieveReplySlack, func(charge *rpc.HeldBytes) {
					defer end()
					res, err := m.prepareRetrieveReply(k, id, []byte(peer), func(n int) ([]byte, error) { return later.ReplyBuffer(n, charge) })
					if errors.Is(err, ErrNotRegistered) {
						// Unregistered while it waited for the gate.
						res, err = m.answerUnregistered(name, id, []byte(peer), protocol.PrepareRetrieveResponse{}), nil
					}
					if err != nil {
						m.errorEvent("request/"+name, id, fmt.Sprintf("%s: %v", name, err))
						res = nil
					}
					later.Answer(res, err)
				})
				return nil, nil
			}
			defer m.begin(id, req.Peer)()
			return m.prepareRetrieveReply(k, id, req.Peer, req.ReplyBuffer)
		})),
		protocol.CommitRetrieve: m.reporting(m.notRegistered(false, func(_ context.Context, req *rpc.Request) (any, error) {
			k, id, err := keyAndInstance(req, 2)
			if err != nil {
				return nil, err
			}
			defer m.begin(id, req.Peer)()
			return m.commitRetrieve(k, id, req.Peer)
		})),
	}
}

// notRegistered answers a request of h that names an instance not
// registered with fail, the request's failure reply in every profile
// (PREPARE_STORE: an empty context, so the worker has no slots and its
// commit is answered false; the commits: false; PREPARE_RETRIEVE: success
// false, a miss), counted and reported. The instance may have been
// unregistered, reaped or removed while its worker lives on: left
// unanswered, every request of that worker would wait out its timeout.
func (m *Module) notRegistered(fail any, h rpc.Handler) rpc.Handler {
	return func(ctx context.Context, req *rpc.Request) (any, error) {
		v, err := h(ctx, req)
		if errors.Is(err, ErrNotRegistered) {
			id, _ := instanceArg(req)
			return m.answerUnregistered(req.Name, id, req.Peer, fail), nil
		}
		return v, err
	}
}

// answerUnregistered counts a request of name for the unregistered instance
// id from peer, reports it (at most once a second), and returns fail.
func (m *Module) answerUnregistered(name string, id int64, peer []byte, fail any) any {
	m.countAndWarn(&m.stats.Unknown, "request/unregistered", id, func() string {
		return fmt.Sprintf("%s for instance %d from %s: not registered (never, or unregistered, reaped or removed since); answered as a failure",
			name, id, peerText(string(peer)))
	})
	return fail
}

// retrieveReplySlack is what a pickle retrieve reply holds beyond its
// chunks' bytes (the msgpack map and each tensor's pickle header), for its
// gate ticket.
const retrieveReplySlack = 64 << 10

// reporting passes a handler's errors to the event sink (rate-limited per
// request name) so the operator sees them, and returns them unchanged.
func (m *Module) reporting(h rpc.Handler) rpc.Handler {
	return func(ctx context.Context, req *rpc.Request) (any, error) {
		v, err := h(ctx, req)
		if err != nil {
			id, _ := instanceArg(req)
			m.errorEvent("request/"+req.Name, id, fmt.Sprintf("%s: %v", req.Name, err))
			return nil, err
		}
		return v, nil
	}
}

// instanceArg guesses the instance id of a request for error reports.
func instanceArg(req *rpc.Request) (int64, bool) {
	for i := range req.Args {
		if id, err := req.Int(i); err == nil {
			return id, true
		}
		if p, err := req.Register(i); err == nil {
			return p.InstanceID, true
		}
	}
	return 0, false
}

func keyAndInstance(req *rpc.Request, n int) (protocol.Key, int64, error) {
	if err := req.Arity(n); err != nil {
		return protocol.Key{}, 0, err
	}
	k, err := req.Key(0)
	if err != nil {
		return protocol.Key{}, 0, err
	}
	id, err := req.Int(1)
	if err != nil {
		return protocol.Key{}, 0, err
	}
	return k, id, nil
}
