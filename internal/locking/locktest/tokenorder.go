package locktest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// tokensGrowInHoldOrderPastTheTrustWindow: three processes, two goroutines
// each, so that a holder's release finds a local waiter to hand the lock
// on to; every third hold lasts longer than a third of the TTL, the window
// in which a backend hands a place of its batch on without a request to
// its server. Past it, the next local holder goes back to the server and
// begins a new batch, and the token it takes must be above every token
// handed out before, in this process and in the others. Tokens are logged
// in hold order (the log is written under the lock) and must grow
// strictly.
//
// Why it is here: a backend that took the new batch's token from the
// lock's create revision (etcd's CreateRevision, a node's czxid) instead of
// from the request that began the batch gave the next holder a token below
// the one the process had just handed on, and every other check of this
// suite, every burst and every fault run still passed.
func tokensGrowInHoldOrderPastTheTrustWindow(t *testing.T, b Backend) {
	noLeaks(t)
	clients := make([]Client, 3)
	for i := range clients {
		clients[i], _ = connect(t, b)
	}
	key := newKey(t)
	long := b.TTL/3 + b.TTL/10

	type hold struct {
		process int
		token   int64
		long    bool
	}
	var mu sync.Mutex
	var log []hold
	const workers, rounds = 6, 4
	errs := make(chan error, 2*workers*rounds)
	var wg sync.WaitGroup
	for w := range workers {
		p := w % len(clients)
		wg.Go(func() {
			for r := range rounds {
				// The lease's context derives from Acquire's (some
				// backends): it is cancelled only after the release.
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second+workers*rounds*long)
				l, err := clients[p].Acquire(ctx, key)
				if err != nil {
					cancel()
					errs <- fmt.Errorf("process %d: %w", p, err)
					return
				}
				isLong := (w+r)%3 == 0
				mu.Lock()
				log = append(log, hold{p, l.Token(), isLong})
				mu.Unlock()
				if isLong {
					// The hold outlives the batch's trust window:
					// this is the expiry under test, not a wait
					// for another goroutine.
					select {
					case <-time.After(long):
					case <-l.Context().Done():
					}
				}
				if cause := context.Cause(l.Context()); cause != nil {
					errs <- fmt.Errorf("process %d lost the lock while holding it: %v", p, cause)
				}
				err = l.Release(context.Background())
				cancel()
				if err != nil {
					errs <- fmt.Errorf("process %d: release: %w", p, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(log) != workers*rounds {
		t.Fatalf("%d holds, want %d", len(log), workers*rounds)
	}
	handedOnAfterLong := 0
	for i := 1; i < len(log); i++ {
		if log[i].token <= log[i-1].token {
			t.Fatalf("hold %d (process %d) got token %d after hold %d (process %d, long=%v) had %d: tokens must grow strictly in hold order\n%v",
				i, log[i].process, log[i].token, i-1, log[i-1].process, log[i-1].long, log[i-1].token, log)
		}
		if log[i-1].long && log[i].process == log[i-1].process {
			handedOnAfterLong++
		}
	}
	// The check could not fail if no long hold was followed by a holder of
	// its own process: that is the hand-over past the window.
	if handedOnAfterLong == 0 {
		t.Fatalf("no long hold was followed by a holder of its own process: the schedule under test never ran\n%v", log)
	}
	t.Logf("%d holds, %d after a long hold in the same process", len(log), handedOnAfterLong)
}
