package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locking/redislock"
)

// TestRedlockFailedRoundReusesPendingWaitGroup: a failed round with a hung
// node leaves releaseSettled's background goroutine blocked in
// a.pending.Wait(); the attempt keeps the same a.pending for its next
// rounds and for the renewals of the lock it then holds (extend: Wait,
// then Add from zero). sync.WaitGroup forbids an Add from zero
// concurrent with a Wait that has not returned ("WaitGroup is reused
// before previous Wait has returned" panics in the background goroutine
// when the renewal's Add lands before it is scheduled; the race detector
// reports it every time).
//
// The scenario runs twice (the race detector reports a race once per pair
// of stacks, and one run is enough in practice).
func TestRedlockFailedRoundReusesPendingWaitGroup(t *testing.T) {
	for range 2 {
		failedRoundThenRenewals(t)
	}
}

func failedRoundThenRenewals(t *testing.T) {
	ctx := context.Background()
	srvs, clients := serviceCluster(t, 5)
	renewed := make(chan error, 16)
	// Renewals every 150ms, calls to the hung node pending for 300ms: each
	// renewal's Wait blocks together with the background release's, and the
	// renewal's Add follows the call that brings the counter to zero.
	r := newRedlock(t, clients, redislock.WithTTL(900*time.Millisecond), redislock.WithNodeTimeout(300*time.Millisecond),
		redislock.WithRenewEvery(150*time.Millisecond),
		redislock.WithPollInterval(50*time.Millisecond), redislock.WithWait(5*time.Second),
		redislock.WithRenewalObserver(func(_ string, err error) {
			select {
			case renewed <- err:
			default:
			}
		}))
	key := uniqueKey(t)
	gate := r.GateNode(key)
	others := otherNodes(gate, 4)
	hung, foreign := others[0], others[1:]
	// Someone else holds a majority for a while (not the gate node, so our
	// gate call wins and the round runs and fails); one node hangs, so the
	// failed round's call to it is still pending when the round releases.
	for _, i := range foreign {
		if err := clients[i].Set(ctx, "lock:"+key, "someone-else", 400*time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
	}
	fault(t, srvs[hung], "hung")
	lease := acquire(t, r, ctx, key)
	// Two renewals: each waits for the pending calls, then adds to the
	// same WaitGroup that the failed round's background release waits on.
	for range 2 {
		select {
		case err := <-renewed:
			if err != nil {
				t.Fatalf("renewal: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no renewal")
		}
	}
	_ = lease.Release(ctx)
}
