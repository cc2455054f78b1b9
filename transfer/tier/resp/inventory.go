package resp

import (
	"context"
	"time"

	"github.com/valkey-io/valkey-go"

	"kvdock/transfer/tier"
)

var _ tier.Inventory = (*Tier)(nil)

// Keys implements tier.Inventory from the index: this host's own values
// under the key prefix (written here, or adopted from the copy of the
// index kept on the server), most recently used first. Other hosts'
// values under the same prefix, and anything else on the server, are not
// listed.
func (t *Tier) Keys(ctx context.Context, limit int) ([]string, int64, error) {
	ks, total := t.idx.keys(limit, time.Now())
	return ks, total, nil
}

// Clear implements tier.Inventory: this host's own values go (UNLINK, and
// out of the shared copy of the index), nothing else on the server.
func (t *Tier) Clear(ctx context.Context) (objects, bytes int64, err error) {
	victims, used := t.idx.takeAll()
	if len(victims) == 0 {
		return 0, 0, nil
	}
	err = t.detached(ctx, "clear", true, func(c valkey.Client, dctx context.Context) error {
		return t.evict(dctx, c, "clear", victims)
	})
	return int64(len(victims)), used, err
}

// keys is up to limit of the indexed keys, most recently used first, and
// how many are indexed.
func (x *index) keys(limit int, now time.Time) ([]string, int64) {
	_, total := x.usage(now)
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]string, 0, min(limit, x.ll.Len()))
	for el := x.ll.Back(); el != nil && len(out) < limit; el = el.Prev() {
		out = append(out, el.Value.(*entry).key)
	}
	return out, total
}

// takeAll empties the index and returns its keys and their bytes.
func (x *index) takeAll() ([]string, int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]string, 0, x.ll.Len())
	used := x.used
	for x.ll.Len() > 0 {
		out = append(out, x.drop(x.ll.Front()).key)
	}
	return out, used
}
