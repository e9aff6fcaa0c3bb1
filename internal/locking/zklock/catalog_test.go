package zklock_test

import (
	"fmt"
	"testing"

	"github.com/flashsale/stock/internal/locking/locktest"
	"github.com/flashsale/stock/internal/locking/zklock"
	"github.com/flashsale/stock/lab/testzk"
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
			locktest.StatePerNameIsBounded(t, locktest.Catalog{
				Client:       locktest.ClientOf(l.Acquire, func() error { return nil }),
				AdvanceFence: l.AdvanceFence,
				Reset:        l.Reset,
				Kept:         l.NamesKept,
				Idle:         c.idle,
				Names:        c.names, FenceEvery: 200,
			})
		})
	}
}
