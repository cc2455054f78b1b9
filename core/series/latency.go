package series

import (
	"math"
	"sync/atomic"
	"time"
)

// latBuckets log-spaced buckets, four per power of two from 1 µs: the last
// one ends near 268 s and takes everything longer. A quantile is reported
// as its bucket's upper bound, so it is at most 19 % high.
const (
	latBuckets   = 112
	latPerOctave = 4
)

// Latency is a histogram of request durations that many goroutines may
// Observe into at once; a Quantiles reads it once a second.
type Latency struct {
	b [latBuckets]atomic.Int64
}

// Observe counts one duration.
func (l *Latency) Observe(d time.Duration) {
	l.b[latBucket(d)].Add(1)
}

// latBucket is the bucket of d: the first whose upper bound is >= d.
func latBucket(d time.Duration) int {
	us := float64(d) / float64(time.Microsecond)
	if us <= 1 {
		return 0
	}
	i := int(math.Ceil(latPerOctave * math.Log2(us)))
	return min(max(i, 0), latBuckets-1)
}

// latBound is bucket i's upper bound in seconds.
func latBound(i int) float64 {
	return 1e-6 * math.Exp2(float64(i)/latPerOctave)
}

// Quantiles is the history of a Latency: requests per second and the p50
// and p99 of each second (in seconds; 0 for a second without requests).
// Each coarse point is the quantile of its ten seconds' requests together,
// not a mean of quantiles.
type Quantiles struct {
	Rate, P50, P99 History

	prev [latBuckets]int64 // the histogram at the previous Sample
	sec  [latBuckets]int64 // the last second's counts
	acc  [latBuckets]int64 // counts since the last coarse point
}

// NewQuantiles returns empty histories.
func NewQuantiles() *Quantiles {
	return &Quantiles{Rate: NewHistory(), P50: NewHistory(), P99: NewHistory()}
}

// Sample reads l and pushes one fine point: the requests observed since the
// previous Sample (elapsed ago) and their quantiles. The first Sample of a
// histogram that already holds counts takes them as the baseline.
func (q *Quantiles) Sample(l *Latency, elapsed time.Duration, first bool) {
	var n int64
	for i := range q.sec {
		v := l.b[i].Load()
		d := v - q.prev[i]
		if first || d < 0 {
			d = 0
		}
		q.prev[i] = v
		q.sec[i] = d
		q.acc[i] += d
		n += d
	}
	rate := 0.0
	if elapsed > 0 {
		rate = float64(n) / elapsed.Seconds()
	}
	q.Rate.Push(rate)
	q.P50.pushWith(quantile(&q.sec, n, 0.50), func() float64 { return q.quantileAcc(0.50) })
	q.P99.pushWith(quantile(&q.sec, n, 0.99), func() float64 {
		v := q.quantileAcc(0.99)
		clear(q.acc[:]) // P99 folds last: the ten seconds are done
		return v
	})
}

func (q *Quantiles) quantileAcc(p float64) float64 {
	var n int64
	for _, c := range q.acc {
		n += c
	}
	return quantile(&q.acc, n, p)
}

// quantile is the upper bound of the bucket holding the p-th of n counts,
// 0 when n is 0.
func quantile(c *[latBuckets]int64, n int64, p float64) float64 {
	if n <= 0 {
		return 0
	}
	rank := int64(math.Ceil(p * float64(n)))
	rank = max(rank, 1)
	var seen int64
	for i, v := range c {
		seen += v
		if seen >= rank {
			return latBound(i)
		}
	}
	return latBound(latBuckets - 1)
}
