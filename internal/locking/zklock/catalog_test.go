package zklock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locking/zklock"
	"github.com/flashsale/stock/internal/testzk"
)

// TestStatePerNameIsBounded: a process that locks every SKU of a catalog
// keeps state only for the names in use and at most WithIdleNames idle
// ones. Many names, each taken twice by goroutines that overlap (so some
// wait and are handed the lock), a fence advanced and a sale reset on some.
func TestStatePerNameIsBounded(t *testing.T) {
	srv := testzk.Start(t)
	for _, c := range []struct{ idle, names int }{{0, 10_000}, {100, 2_000}} {
		t.Run(fmt.Sprintf("idle=%d", c.idle), func(t *testing.T) {
			l := newLocker(t, []string{srv.Addr}, zklock.WithIdleNames(c.idle))
			idle, names, workers := c.idle, c.names, 16
			prefix := uniqueName(t)
			var (
				next     atomic.Int64
				mu       sync.Mutex
				failures []error
				most     int
				wg       sync.WaitGroup
			)
			fail := func(err error) {
				mu.Lock()
				defer mu.Unlock()
				if len(failures) < 10 {
					failures = append(failures, err)
				}
			}
			for range workers {
				wg.Go(func() {
					for {
						i := next.Add(1) - 1
						if i >= int64(2*names) {
							return
						}
						name := fmt.Sprintf("%s-%d", prefix, i/2)
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
						le, err := l.Acquire(ctx, name)
						if err != nil {
							cancel()
							fail(fmt.Errorf("acquire %s: %w", name, err))
							continue
						}
						if i%200 == 1 {
							if err := l.AdvanceFence(ctx, name, le.Token()); err != nil {
								fail(fmt.Errorf("advance the fence of %s: %w", name, err))
							}
						}
						if err := le.Release(ctx); err != nil {
							fail(fmt.Errorf("release %s: %w", name, err))
						}
						if i%200 == 3 {
							if err := l.Reset(ctx, name); err != nil {
								fail(fmt.Errorf("reset %s: %w", name, err))
							}
						}
						cancel()
						kept := l.NamesKept()
						mu.Lock()
						most = max(most, kept)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			for _, err := range failures {
				t.Error(err)
			}
			// In use: at most one name per worker (the other taker of a
			// name waits on the same state).
			if most > idle+workers {
				t.Errorf("kept state for %d names at once, want at most %d idle + %d in use", most, idle, workers)
			}
			if kept := l.NamesKept(); kept > idle {
				t.Errorf("kept state for %d names once all were released, want at most %d", kept, idle)
			}
			// The names still work: state is read again where it was forgotten.
			le := acquire(t, l, context.Background(), prefix+"-0")
			release(t, le)
		})
	}
}
