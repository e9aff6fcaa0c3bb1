package zklock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/zklock"
	"github.com/flashsale/stock/lab/testzk"
)

// TestEnsembleLeaderKilled: a holder whose ensemble loses its leader loses
// its lease (its server drops the connection: SUSPENDED); once a new
// leader is elected the lock can be taken again, with a greater token.
func TestEnsembleLeaderKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three JVMs")
	}
	e := testzk.StartEnsemble(t, 3)
	name := uniqueName(t)
	// A session long enough to outlast an election.
	l := newLocker(t, e.Addrs(), zklock.WithSessionTimeout(4*time.Second))
	held := acquire(t, l, t.Context(), name)
	leader := e.Leader()
	if leader < 0 {
		t.Fatal("no leader")
	}
	e.Kill(leader)
	select {
	case <-held.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease outlived its ensemble's leader by 10s")
	}
	if cause := context.Cause(held.Context()); !errors.Is(cause, locking.ErrLockLost) {
		t.Fatalf("the lease ended with %v, want ErrLockLost", cause)
	}
	if err := held.Release(context.Background()); !errors.Is(err, locking.ErrLockLost) {
		t.Fatalf("Release = %v, want ErrLockLost", err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		le, err := l.Acquire(ctx, name)
		if err == nil {
			if le.Token() <= held.Token() {
				t.Fatalf("token %d after the election, %d before", le.Token(), held.Token())
			}
			release(t, le)
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no lock after the election: %v", err)
		}
	}
	if err := e.Start(leader); err != nil {
		t.Fatal(err)
	}
}
