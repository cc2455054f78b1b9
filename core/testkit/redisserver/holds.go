package redisserver

import (
	"context"
	"fmt"

	"github.com/valkey-io/valkey-go"
)

// Holds returns every key of the server matching pattern (SCAN MATCH) with
// the bytes MEMORY USAGE gives for it: what the server really spends on it,
// the allocator's rounding included.
func (s *Server) Holds(ctx context.Context, pattern string) (map[string]int64, error) {
	c, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{s.Addr}, Password: s.opts.Password,
		ForceSingleClient: true, DisableCache: true,
	})
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", s.Addr, err)
	}
	defer c.Close()
	out := map[string]int64{}
	var cursor uint64
	for {
		e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(pattern).Count(1000).Build()).AsScanEntry()
		if err != nil {
			return nil, fmt.Errorf("scan %s: %w", s.Addr, err)
		}
		for _, k := range e.Elements {
			n, err := c.Do(ctx, c.B().MemoryUsage().Key(k).Samples(0).Build()).AsInt64()
			if valkey.IsValkeyNil(err) {
				continue // gone since the scan
			}
			if err != nil {
				return nil, fmt.Errorf("memory usage of %q: %w", k, err)
			}
			out[k] = n
		}
		if cursor = e.Cursor; cursor == 0 {
			return out, nil
		}
	}
}
