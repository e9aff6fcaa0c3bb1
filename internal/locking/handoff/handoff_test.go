package handoff_test

import (
	"context"
	"errors"
	"runtime"
	"testing"

	"github.com/flashsale/stock/internal/locking/handoff"
)

// waitQueued waits, by yielding, until n goroutines wait behind key's owner.
func waitQueued(t *testing.T, q *handoff.Queue[int], key string, n int) {
	t.Helper()
	for q.Waiting(key) < n {
		select {
		case <-t.Context().Done():
			t.Fatal("test ended before the waiters queued")
		default:
			runtime.Gosched() // let the goroutines that join the queue run
		}
	}
}

func TestFirstComeFirstServed(t *testing.T) {
	q := handoff.New[int]()
	ctx := t.Context()
	if turn, err := q.Wait(ctx, "k", nil); err != nil || turn.Handed {
		t.Fatalf("first Wait = %+v, %v; want the turn without a hold", turn, err)
	}
	got := make(chan int, 3)
	for i := 1; i <= 3; i++ {
		go func() {
			turn, err := q.Wait(ctx, "k", nil)
			if err != nil {
				got <- -1
				return
			}
			got <- turn.Hold
			if !q.Pass("k", turn.Hold+10) {
				q.Done("k")
			}
		}()
		waitQueued(t, q, "k", i)
	}
	if !q.Pass("k", 100) {
		t.Fatal("Pass found no waiter")
	}
	for _, want := range []int{100, 110, 120} {
		if h := <-got; h != want {
			t.Fatalf("hold %d reached a waiter, want %d (first come, first served)", h, want)
		}
	}
	if q.Waiting("k") != 0 {
		t.Fatal("waiters left")
	}
}

func TestDoneLetsTheNextTakeTheLockItself(t *testing.T) {
	q := handoff.New[int]()
	ctx := t.Context()
	_, _ = q.Wait(ctx, "k", nil)
	got := make(chan handoff.Turn[int], 1)
	go func() {
		turn, _ := q.Wait(ctx, "k", nil)
		got <- turn
	}()
	waitQueued(t, q, "k", 1)
	q.Done("k")
	if turn := <-got; turn.Handed {
		t.Fatalf("Done handed a hold: %+v", turn)
	}
	if q.Pass("k", 1) {
		t.Fatal("Pass found a waiter in an empty queue")
	}
	q.Done("k")
	// The line is forgotten: the next Wait gets the turn at once.
	if turn, err := q.Wait(ctx, "k", nil); err != nil || turn.Handed {
		t.Fatalf("Wait after the last Done = %+v, %v", turn, err)
	}
}

func TestGivingUpLeavesTheQueue(t *testing.T) {
	q := handoff.New[int]()
	_, _ = q.Wait(t.Context(), "k", nil)
	ctx, cancel := context.WithCancelCause(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := q.Wait(ctx, "k", func(handoff.Turn[int]) { t.Error("giveBack called for a turn never given") })
		errc <- err
	}()
	waitQueued(t, q, "k", 1)
	stop := errors.New("gave up")
	cancel(stop)
	if err := <-errc; !errors.Is(err, stop) {
		t.Fatalf("Wait = %v, want the context's cause", err)
	}
	if q.Pass("k", 1) {
		t.Fatal("a waiter that gave up was handed the lock")
	}
}

// A turn handed over as its waiter gives up is not lost: giveBack gets it
// and passes it to the next waiter.
func TestTurnHandedAsTheWaiterGivesUp(t *testing.T) {
	for range 200 {
		q := handoff.New[int]()
		_, _ = q.Wait(t.Context(), "k", nil)
		ctx, cancel := context.WithCancel(t.Context())
		gaveUp := make(chan struct{})
		go func() {
			defer close(gaveUp)
			passOn := func(turn handoff.Turn[int]) {
				if !q.Pass("k", turn.Hold) {
					q.Done("k")
				}
			}
			// Whether it got the turn or gave up as it came, the turn
			// goes on to the next waiter.
			if turn, err := q.Wait(ctx, "k", passOn); err == nil {
				passOn(turn)
			}
		}()
		waitQueued(t, q, "k", 1)
		next := make(chan handoff.Turn[int], 1)
		go func() {
			turn, _ := q.Wait(t.Context(), "k", nil)
			next <- turn
		}()
		waitQueued(t, q, "k", 2)
		// Race the cancellation against the hand-over.
		go cancel()
		q.Pass("k", 7)
		<-gaveUp
		select {
		case turn := <-next:
			if turn.Handed && turn.Hold != 7 {
				t.Fatalf("next waiter got %+v", turn)
			}
		case <-t.Context().Done():
			t.Fatal("the turn was lost: the next waiter never got it")
		}
		cancel()
	}
}

// Claim takes the longest waiter out of the line and tells the caller who
// it is; the turn reaches it only with Give, and a waiter that queues in
// between waits behind it.
func TestClaimThenGive(t *testing.T) {
	q := handoff.New[int]()
	ctx := t.Context()
	_, _ = q.Wait(ctx, "k", nil)
	first := make(chan handoff.Turn[int], 1)
	go func() {
		turn, _ := q.WaitAs(ctx, "k", "first", nil)
		first <- turn
	}()
	waitQueued(t, q, "k", 1)
	c := q.Claim("k")
	if c == nil || c.Who() != "first" {
		t.Fatalf("Claim = %+v, want the waiter that gave WaitAs \"first\"", c)
	}
	if q.Claim("k") != nil || q.Waiting("k") != 0 {
		t.Fatal("the claimed waiter is still in the line")
	}
	second := make(chan handoff.Turn[int], 1)
	go func() {
		turn, _ := q.Wait(ctx, "k", nil)
		second <- turn
	}()
	waitQueued(t, q, "k", 1) // behind the claimed one: the turn is still ours
	select {
	case turn := <-first:
		t.Fatalf("the claimed waiter got %+v before Give", turn)
	default:
	}
	c.Give(handoff.Turn[int]{Hold: 5, Handed: true})
	if turn := <-first; !turn.Handed || turn.Hold != 5 {
		t.Fatalf("claimed waiter got %+v, want hold 5", turn)
	}
	q.Done("k")
	if turn := <-second; turn.Handed {
		t.Fatalf("second waiter got %+v after Done", turn)
	}
}

// A claimed waiter that gives up as the turn is given still receives it:
// from WaitAs, or in giveBack, never lost.
func TestClaimedWaiterThatGivesUpKeepsTheTurn(t *testing.T) {
	for range 200 {
		q := handoff.New[int]()
		_, _ = q.Wait(t.Context(), "k", nil)
		ctx, cancel := context.WithCancel(t.Context())
		got := make(chan handoff.Turn[int], 2)
		go func() {
			turn, err := q.WaitAs(ctx, "k", 1, func(turn handoff.Turn[int]) { got <- turn })
			if err == nil {
				got <- turn
			}
		}()
		waitQueued(t, q, "k", 1)
		c := q.Claim("k")
		go cancel() // races the Give
		c.Give(handoff.Turn[int]{Hold: 9, Handed: true})
		if turn := <-got; turn.Hold != 9 {
			t.Fatalf("the claimed waiter got %+v, want hold 9", turn)
		}
		cancel()
	}
}
