package resp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"kvdock/core/testkit/redisserver"
)

// BenchmarkTierVsRaw measures the tier's Put/Get against valkey-go's own
// SET/GET of the same values on the same server in the same loop, one call
// at a time, alternating which goes first, and reports the throughputs and
// the ratios tier/raw (the target is ≥ 0.7). The tier's calls carry a
// deadline, as the engine's do; the raw calls do not (the client's best case).
//
//	go test -run '^$' -bench TierVsRaw -benchtime 20x ./transfer/tier/resp/
func BenchmarkTierVsRaw(b *testing.B) {
	for _, mode := range []string{"standalone", "cluster"} {
		var cfg RESPConfig
		var addrs []string
		if mode == "cluster" {
			c := redisserver.StartCluster(b, 3)
			addrs = c.Addrs()
			cfg = RESPConfig{Cluster: true, StartupNodes: addrs}
		} else {
			s := redisserver.Start(b, redisserver.Options{})
			addrs = []string{s.Addr}
			cfg = standaloneCfg(s)
		}
		cfg.NumWorkers, cfg.CapacityBytes, cfg.KeyPrefix = 8, 8<<30, "bench:"
		for _, size := range []int{128 << 10, 32 << 20} {
			b.Run(fmt.Sprintf("%s/%dKiB", mode, size>>10), func(b *testing.B) {
				benchPair(b, cfg, addrs, size)
			})
		}
	}
}

func benchPair(b *testing.B, cfg RESPConfig, addrs []string, size int) {
	ctx := context.Background()
	tr, err := Open(ctx, cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	raw, err := valkey.NewClient(valkey.ClientOption{InitAddress: addrs, ForceSingleClient: !cfg.Cluster, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	val := value(1, size)
	tctx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	var tierPut, rawPut, tierGet, rawGet time.Duration
	timed := func(d *time.Duration, f func() error) {
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		*d += time.Since(t0)
	}
	b.SetBytes(int64(4 * size))
	i := 0
	for b.Loop() {
		k := key(i % 8)
		putT := func() error { return tr.Put(tctx, k, val) }
		putR := func() error {
			return raw.Do(ctx, raw.B().Set().Key("raw:"+k).Value(valkey.BinaryString(val)).Build()).Error()
		}
		getT := func() error { _, err := tr.Get(tctx, k); return err }
		getR := func() error { _, err := raw.Do(ctx, raw.B().Get().Key("raw:"+k).Build()).AsBytes(); return err }
		if i%2 == 0 {
			timed(&tierPut, putT)
			timed(&rawPut, putR)
			timed(&tierGet, getT)
			timed(&rawGet, getR)
		} else {
			timed(&rawPut, putR)
			timed(&tierPut, putT)
			timed(&rawGet, getR)
			timed(&tierGet, getT)
		}
		i++
	}
	mbs := func(d time.Duration) float64 { return float64(i) * float64(size) / d.Seconds() / 1e6 }
	b.ReportMetric(mbs(tierPut), "tierPut-MB/s")
	b.ReportMetric(mbs(rawPut), "rawSET-MB/s")
	b.ReportMetric(mbs(tierGet), "tierGet-MB/s")
	b.ReportMetric(mbs(rawGet), "rawGET-MB/s")
	b.ReportMetric(rawPut.Seconds()/tierPut.Seconds(), "put-ratio")
	b.ReportMetric(rawGet.Seconds()/tierGet.Seconds(), "get-ratio")
}
