package dblock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locking/dblock"
	"github.com/flashsale/stock/internal/locking/locktest"
	"github.com/flashsale/stock/lab/testdb"
)

// benchTTL is the service's default LOCK_TTL.
const benchTTL = 5 * time.Second

func leaseLock(l *dblock.Locker, name string) locktest.LockFunc {
	return func(ctx context.Context) (func() error, error) {
		le, err := l.Acquire(ctx, name)
		if err != nil {
			return nil, err
		}
		return func() error { return le.Release(context.Background()) }, nil
	}
}

// BenchmarkDBContended: 8 and 32 contenders take and release one lock of
// the table, with an empty critical section, on each engine: goroutines of
// one process (one Locker: they queue in the process and one polls), of
// four processes, and every contender a process of its own (each polls the
// table: the textbook table without the local queue). Reported as every
// backend's lock benchmark (locktest.Contend): cycles/s, p50 and p99 of the
// wait (ms), fairness.
func BenchmarkDBContended(b *testing.B) {
	for _, engine := range engines {
		dbURL := testdb.MigratedURL(b, engine)
		for _, contenders := range []int{8, 32} {
			for _, procs := range []int{1, 4, contenders} {
				name := fmt.Sprintf("%s/contenders=%d/procs=%d", engine, contenders, procs)
				b.Run(name, func(b *testing.B) {
					lockers := make([]*dblock.Locker, procs)
					for p := range lockers {
						lockers[p] = open(b, dbURL, dblock.WithTTL(benchTTL))
					}
					locks := make([]locktest.LockFunc, contenders)
					for i := range locks {
						locks[i] = leaseLock(lockers[i%procs], name)
					}
					locktest.Contend(b, locks, 0)
				})
			}
		}
	}
}
