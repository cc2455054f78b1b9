package rpc

import "sync"

// inBudget counts the payload bytes of requests queued for the workers, per
// peer and in total: the socket goroutine charges a request before queueing
// it and the worker releases it once the handler is done with the frames.
type inBudget struct {
	mu    sync.Mutex
	peer  map[string]int64
	total int64
	freed chan struct{} // capacity 1: a release happened
}

// tryCharge charges n bytes to peer if both budgets allow it. A request is
// always admitted when nothing of its peer is queued and the total is within
// budget, or when nothing at all is queued, so one message of any legal size
// gets through.
func (b *inBudget) tryCharge(peer []byte, n, perPeer, total int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	have := b.peer[string(peer)]
	peerOK := have == 0 || have+n <= perPeer
	totalOK := b.total == 0 || b.total+n <= total
	if !peerOK || !totalOK {
		return false
	}
	b.peer[string(peer)] = have + n
	b.total += n
	return true
}

func (b *inBudget) release(peer []byte, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	if left := b.peer[string(peer)] - n; left > 0 {
		b.peer[string(peer)] = left
	} else {
		delete(b.peer, string(peer))
	}
	b.total -= n
	b.mu.Unlock()
	select {
	case b.freed <- struct{}{}:
	default:
	}
}

func (b *inBudget) queued() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}
