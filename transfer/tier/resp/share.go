package resp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"
)

// A host's share of the server: the values it wrote count against its
// max_capacity_gb, at what the server says each takes (MEMORY USAGE: the
// value with the allocator's rounding, 5 MiB for a 4 MiB chunk), also
// across restarts. The values' keys name chunks, not hosts (hosts share
// them), so each host keeps the list of its own on the server: a hash
// <key_prefix>index:<instance>, field = key, value = the write's time in
// Unix milliseconds. A write adds its field, an eviction or a delete drops
// it, and at start a host adopts its fields of earlier runs in the
// background: each key still on the server counts at its size, the oldest
// writes as the least recently used; fields whose key is gone are dropped.
// Every reply is outside input: a field longer than any key of ours, a
// time that is no number, or more fields than the index holds are refused
// (the first two dropped from the hash); a size past the largest a value
// of ours takes counts at that largest; and the load is bounded in pages
// (a cursor seen before, or more pages than the index's entries fill, ends
// it with the reason, not retried), in the key bytes it keeps, and in time.
// The tier serves meanwhile: the load takes no worker slot.

const (
	// shareLoadLimit bounds the start's load of the share, waits for the
	// server included.
	shareLoadLimit = 2 * time.Minute
	// sharePage is the fields asked per HSCAN and sized per pipeline.
	sharePage = 512
	// maxOwnKeyBytes is longer than any key of ours (a model name of 256
	// bytes, a salt of 128, the hash, rank, group and fingerprint).
	maxOwnKeyBytes = 1024
	// hdelBatch bounds the fields of one HDEL.
	hdelBatch = 512
	// maxSharePages bounds the HSCAN pages of one load: four times what
	// maxIndexEntries fields fill at sharePage a page (a server may answer
	// fewer fields than asked).
	maxSharePages = 4 * maxIndexEntries / sharePage
	// maxShareKeyBytes bounds the key bytes one load adopts (a real key
	// is about 150 bytes: 262,144 of them take 38 MiB); past it the load
	// ends, and what it adopted so far counts.
	maxShareKeyBytes = 64 << 20
	// maxValueUsage is the most one value of ours takes on the server: the
	// largest value (maxValueBytes) with the allocator's rounding, at most
	// doubled. A larger answer to MEMORY USAGE counts as this.
	maxValueUsage = 2 * maxValueBytes
)

// errShareBound ends a load of the share that a bound stopped: the server
// answered as no server of ours would, and asking again would not help.
var errShareBound = errors.New("load share")

// instanceName is cfg's Instance, else the host name, with every byte
// outside [A-Za-z0-9._-] made '_' (it becomes part of a key).
func instanceName(cfg RESPConfig) string {
	name := cfg.Instance
	if name == "" {
		name, _ = os.Hostname()
	}
	if name == "" {
		name = "localhost"
	}
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '_'
	}, name)
}

// shareKey is the hash listing this host's values. No chunk's key looks
// like it (theirs begin with 64 hex digits and an '@').
func (t *Tier) shareKey() string { return t.cfg.KeyPrefix + "index:" + t.instance }

// sizes returns what each of keys takes on the server, -1 for a key that is
// absent: MEMORY USAGE, or STRLEN from a server that refuses it (no value
// of ours is empty).
func (t *Tier) sizes(ctx context.Context, c valkey.Client, keys []string) ([]int64, error) {
	out := make([]int64, len(keys))
	if !t.noMemoryUsage.Load() {
		cmds := make(valkey.Commands, len(keys))
		for i, k := range keys {
			cmds[i] = c.B().MemoryUsage().Key(t.serverKey(k)).Samples(0).Build()
		}
		refused := false
		for i, r := range c.DoMulti(ctx, cmds...) {
			n, err := r.AsInt64()
			switch {
			case err == nil:
				out[i] = min(max(n, 1), maxValueUsage)
			case valkey.IsValkeyNil(err):
				out[i] = -1
			default:
				if _, reply := serverErr(err); !reply {
					return nil, err
				}
				refused = true
			}
		}
		if !refused {
			return out, nil
		}
		t.noMemoryUsage.Store(true)
		t.log.Warn("resp tier: the server refuses MEMORY USAGE; values count at their length, without the server's overhead")
	}
	cmds := make(valkey.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = c.B().Strlen().Key(t.serverKey(k)).Build()
	}
	for i, r := range c.DoMulti(ctx, cmds...) {
		n, err := r.AsInt64()
		if err != nil {
			return nil, err
		}
		out[i] = min(n, maxValueUsage)
		if n <= 0 {
			out[i] = -1
		}
	}
	return out, nil
}

// written does what follows a write of size bytes under key: the value
// counts at what the server says it takes, the share lists it, and values
// past the capacity go. A failure here does not undo the write (the value
// is stored); it marks the tier down or degraded as any call's would.
func (t *Tier) written(ctx context.Context, key string, size int64) {
	t.absent.forget(key)
	t.learn(size)
	t.writeBytes.Add(uint64(size))
	t.recovered()
	c, _, err := t.usable(true)
	if err != nil {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout) // see detached
	defer cancel()
	sz, err := t.sizes(rctx, c, []string{key})
	if err != nil {
		_ = t.fail(rctx, "put", err)
		return
	}
	if sz[0] < 0 {
		t.idx.remove(key) // gone already (another host, the server's own eviction)
		return
	}
	victims := t.idx.resize(key, sz[0], time.Now())
	cmds := valkey.Commands{c.B().Hset().Key(t.shareKey()).FieldValue().FieldValue(key, strconv.FormatInt(time.Now().UnixMilli(), 10)).Build()}
	if t.cfg.TTL > 0 {
		// The list outlives none of its values by more than the TTL.
		cmds = append(cmds, c.B().Expire().Key(t.shareKey()).Seconds(int64(t.cfg.TTL/time.Second)).Build())
	}
	for _, r := range c.DoMulti(rctx, cmds...) {
		if err := r.Error(); err != nil {
			_ = t.fail(rctx, "put", err)
			return
		}
	}
	_ = t.evict(rctx, c, "evict", victims)
}

// evict deletes victims from the server and from the share (through c);
// op names the call in an error.
// Victims are out of the index already: a failed UNLINK leaves them on the
// server until their TTL or the server's own eviction, which an
// approximate budget tolerates.
func (t *Tier) evict(ctx context.Context, c valkey.Client, op string, victims []string) error {
	for len(victims) > 0 {
		batch := victims[:min(len(victims), hdelBatch)]
		victims = victims[len(batch):]
		cmds := make(valkey.Commands, 0, len(batch)+1)
		for _, v := range batch {
			// UNLINK: the server frees the value off its event loop (a
			// 32 MiB free stalls every client's command for ms).
			cmds = append(cmds, c.B().Unlink().Key(t.serverKey(v)).Build())
		}
		cmds = append(cmds, c.B().Hdel().Key(t.shareKey()).Field(batch...).Build())
		for _, r := range c.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				return t.fail(ctx, op, err)
			}
		}
	}
	return nil
}

// loadShare adopts this host's values of earlier runs (see the top of this
// file), retrying while the server is down or the load fails, within
// shareLoadLimit. Close ends it (t.bg) and waits for it (t.refreshes).
func (t *Tier) loadShare() {
	defer t.refreshes.Done()
	defer t.idx.loadEnded()
	ctx, cancel := context.WithTimeout(t.bg, shareLoadLimit)
	defer cancel()
	start := time.Now()
	retry := time.Second
	for {
		c, _, err := t.usable(true)
		if err == nil {
			var n int
			var bytes int64
			n, bytes, err = t.loadShareOnce(ctx, c)
			if err == nil || errors.Is(err, errShareBound) {
				if err != nil {
					t.log.Warn("resp tier: stopped loading this host's values of earlier runs; the rest count only once rewritten",
						"share", t.shareKey(), "reason", err)
				}
				// Ended before the log says so: a reader of the log (a test,
				// an operator) may take the load as over once it reads it.
				t.idx.loadEnded()
				t.log.Info("resp tier: adopted this host's values of earlier runs", "share", t.shareKey(),
					"values", n, "bytes", bytes, "took", time.Since(start).Round(time.Millisecond))
				return
			}
			t.log.Warn("resp tier: loading this host's values of earlier runs", "share", t.shareKey(), "err", err)
		}
		select {
		case <-ctx.Done():
			t.idx.loadEnded() // before the log, as above
			if t.bg.Err() == nil {
				t.log.Warn("resp tier: gave up loading this host's values of earlier runs; they count only once rewritten",
					"share", t.shareKey(), "limit", shareLoadLimit)
			}
			return
		case <-time.After(retry):
			retry = min(2*retry, 30*time.Second)
		}
	}
}

// loadShareOnce reads the share through c, page by page, sizes each key
// and adopts the keys present. It returns how many values it adopted and
// their bytes; a bound that stopped it (errShareBound) still adopts what
// the pages before it listed.
func (t *Tier) loadShareOnce(ctx context.Context, c valkey.Client) (int, int64, error) {
	now := time.Now()
	var entries []entry
	var cursor uint64
	fields := 0
	var keyBytes int64
	// Cursors already answered: one seen again is a loop (a server's
	// cursor never repeats within one scan). At most maxSharePages.
	seen := map[uint64]struct{}{0: {}}
	var stop error
	for pages := 1; ; pages++ {
		e, err := c.Do(ctx, c.B().Hscan().Key(t.shareKey()).Cursor(cursor).Count(sharePage).Build()).AsScanEntry()
		if err != nil {
			return 0, 0, t.fail(ctx, "load share", err)
		}
		if len(e.Elements)%2 != 0 {
			return 0, 0, fmt.Errorf("load share: HSCAN answered %d elements, not field-value pairs", len(e.Elements))
		}
		if fields += len(e.Elements) / 2; fields > 2*maxIndexEntries {
			// HSCAN may repeat a field, not this often.
			stop = fmt.Errorf("%w: more than %d fields in %s", errShareBound, 2*maxIndexEntries, t.shareKey())
			break
		}
		var page []entry
		var bad []string
		for i := 0; i < len(e.Elements); i += 2 {
			key, v := e.Elements[i], e.Elements[i+1]
			ms, err := strconv.ParseInt(v, 10, 64)
			if len(key) == 0 || len(key) > maxOwnKeyBytes || err != nil || ms <= 0 {
				bad = append(bad, key)
				continue
			}
			if keyBytes += int64(len(key)); keyBytes > maxShareKeyBytes {
				stop = fmt.Errorf("%w: the keys listed in %s pass %d bytes", errShareBound, t.shareKey(), maxShareKeyBytes)
				break
			}
			page = append(page, entry{key: strings.Clone(key), written: time.UnixMilli(ms)})
		}
		if err := t.adoptPage(ctx, c, page, bad, &entries); err != nil {
			return 0, 0, err
		}
		if stop != nil {
			break
		}
		if len(entries) > maxIndexEntries {
			stop = fmt.Errorf("%w: more than %d values listed in %s", errShareBound, maxIndexEntries, t.shareKey())
			entries = entries[:maxIndexEntries]
			break
		}
		if cursor = e.Cursor; cursor == 0 {
			break
		}
		if _, again := seen[cursor]; again {
			stop = fmt.Errorf("%w: HSCAN of %s answered cursor %d again after %d pages: the scan does not advance", errShareBound, t.shareKey(), cursor, pages)
			break
		}
		if pages >= maxSharePages {
			stop = fmt.Errorf("%w: HSCAN of %s not done after %d pages (%d fields)", errShareBound, t.shareKey(), pages, fields)
			break
		}
		seen[cursor] = struct{}{}
	}
	slices.SortFunc(entries, func(a, b entry) int { return a.written.Compare(b.written) })
	var bytes int64
	for _, e := range entries {
		bytes += e.size
	}
	if victims := t.idx.adopt(entries, now); len(victims) > 0 {
		if err := t.evict(ctx, c, "evict", victims); err != nil {
			return 0, 0, err
		}
	}
	return len(entries), bytes, stop
}

// adoptPage sizes one page's keys and adds those present to entries; the
// fields of keys gone, and bad fields, leave the share.
func (t *Tier) adoptPage(ctx context.Context, c valkey.Client, page []entry, bad []string, entries *[]entry) error {
	if len(page) > 0 {
		keys := make([]string, len(page))
		for i, e := range page {
			keys[i] = e.key
		}
		sz, err := t.sizes(ctx, c, keys)
		if err != nil {
			return t.fail(ctx, "load share", err)
		}
		for i, e := range page {
			if sz[i] < 0 {
				bad = append(bad, e.key)
				continue
			}
			e.size = sz[i]
			*entries = append(*entries, e)
		}
	}
	for len(bad) > 0 {
		batch := bad[:min(len(bad), hdelBatch)]
		bad = bad[len(batch):]
		if err := c.Do(ctx, c.B().Hdel().Key(t.shareKey()).Field(batch...).Build()).Error(); err != nil {
			return t.fail(ctx, "load share", err)
		}
	}
	return nil
}
