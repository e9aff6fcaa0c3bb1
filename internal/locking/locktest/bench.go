package locktest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// LockFunc takes the benchmark's lock and returns its release.
type LockFunc func(ctx context.Context) (unlock func() error, err error)

// Contend is the lock benchmark every backend runs, so that their figures
// line up: one goroutine per LockFunc (a contender), b.N lock cycles in
// all, claimed first come, first served; each cycle takes the lock, works
// for criticalSection (0: an empty section) and releases. It reports
// cycles/s, the p50 and p99 of the wait for the lock (p50-wait-ms,
// p99-wait-ms) and fairness: the fewest cycles of one contender over the
// most. A failed lock or unlock fails b.
func Contend(b *testing.B, locks []LockFunc, criticalSection time.Duration) {
	var claimed atomic.Int64
	waits := make([][]time.Duration, len(locks))
	var (
		mu   sync.Mutex
		errs []error
	)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g, lock := range locks {
		wg.Go(func() {
			<-start
			for claimed.Add(1) <= int64(b.N) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				t0 := time.Now()
				unlock, err := lock(ctx)
				waits[g] = append(waits[g], time.Since(t0))
				cancel()
				if err == nil && criticalSection > 0 {
					time.Sleep(criticalSection) // the critical section's work
				}
				if err == nil {
					err = unlock()
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("contender %d: %w", g, err))
					mu.Unlock()
					return
				}
			}
		})
	}
	b.ResetTimer()
	t0 := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	b.StopTimer()
	if len(errs) > 0 {
		b.Fatal(errors.Join(errs[:min(len(errs), 10)]...))
	}
	all := slices.Concat(waits...)
	slices.Sort(all)
	fewest, most := len(waits[0]), len(waits[0])
	for _, w := range waits {
		fewest, most = min(fewest, len(w)), max(most, len(w))
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
	b.ReportMetric(ms(percentile(all, 0.50)), "p50-wait-ms")
	b.ReportMetric(ms(percentile(all, 0.99)), "p99-wait-ms")
	b.ReportMetric(float64(fewest)/float64(max(most, 1)), "fairness")
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*p))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
