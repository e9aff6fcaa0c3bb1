package locktest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Catalog is one process's Locker as StatePerNameIsBounded drives it.
type Catalog struct {
	// Client takes the names.
	Client Client
	// AdvanceFence raises a name's fence (every backend has it).
	AdvanceFence func(ctx context.Context, name string, atLeast int64) error
	// Reset begins a new sale of a name; nil leaves it out.
	Reset func(ctx context.Context, name string) error
	// Kept is the number of names the Locker keeps state for.
	Kept func() int
	// Idle is how many idle names the Locker may keep (a cache).
	Idle int
	// Names are taken twice each; every FenceEvery-th hold advances its
	// fence, and the sale of every FenceEvery-th name is reset after.
	Names, FenceEvery int
	// FencesOnly more names get their fence advanced without a lock.
	FencesOnly int
}

// StatePerNameIsBounded: a process that locks every SKU of a catalog keeps
// state only for the names in use, and at most c.Idle idle ones, whatever
// the number of names it has seen: 16 goroutines take each name twice,
// overlapping (so some wait and are handed the lock), advance fences and
// reset sales on some; then the names still work.
func StatePerNameIsBounded(t *testing.T, c Catalog) {
	const workers = 16
	prefix := newKey(t)
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
	taken := int64(2 * c.Names)
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= taken+int64(c.FencesOnly) {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				if i >= taken {
					name := fmt.Sprintf("%s-fence-%d", prefix, i)
					if err := c.AdvanceFence(ctx, name, 1); err != nil {
						fail(fmt.Errorf("advance the fence of %s: %w", name, err))
					}
					cancel()
					continue
				}
				name := fmt.Sprintf("%s-%d", prefix, i/2)
				le, err := c.Client.Acquire(ctx, name)
				if err != nil {
					cancel()
					fail(fmt.Errorf("acquire %s: %w", name, err))
					continue
				}
				if i%int64(c.FenceEvery) == 1 {
					if err := c.AdvanceFence(ctx, name, le.Token()); err != nil {
						fail(fmt.Errorf("advance the fence of %s: %w", name, err))
					}
				}
				kept := c.Kept()
				if err := le.Release(ctx); err != nil {
					fail(fmt.Errorf("release %s: %w", name, err))
				}
				if c.Reset != nil && i%int64(c.FenceEvery) == 3%int64(c.FenceEvery) && i%2 == 1 {
					if err := c.Reset(ctx, name); err != nil {
						fail(fmt.Errorf("reset %s: %w", name, err))
					}
				}
				cancel()
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
	// In use: at most one name per worker (the other taker of a name
	// waits on the same state).
	if most > c.Idle+workers {
		t.Errorf("kept state for %d names at once, want at most %d idle + %d in use", most, c.Idle, workers)
	}
	if kept := c.Kept(); kept > c.Idle {
		t.Errorf("kept state for %d names once all were released, want at most %d", kept, c.Idle)
	}
	// The names still work: state is read again where it was forgotten.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	le, err := c.Client.Acquire(ctx, prefix+"-0")
	if err != nil {
		t.Fatalf("a name taken again: %v", err)
	}
	if err := le.Release(ctx); err != nil {
		t.Errorf("release: %v", err)
	}
}
