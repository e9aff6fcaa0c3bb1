// Package handoff queues the goroutines of one process that want the same
// lock, first come first served, so that only one of them at a time talks
// to the lock service, and the lock passes from one to the next inside the
// process without a trip through the service's queue.
//
// It is the part of a lock recipe that does not depend on the service: the
// etcd and ZooKeeper backends use it as it is. What travels with a hand-over
// (a hold: the service-side key, its session, how many more local
// hand-overs it may make before the lock goes back to the other processes)
// is the backend's type H.
//
// A hand-over must still give the next holder a greater fencing token; the
// backend does that (a write that the service orders after every earlier
// one, or the next place of a two-part token), not here.
//
// A backend whose release must name its successor to the service (the
// Redis lock hands the lock straight to the successor's value in Redis)
// takes the successor out of the line first (Claim), talks to the service,
// and then gives it the turn (Claimed.Give); a waiter can carry what the
// backend needs to know about it (WaitAs).
package handoff

import (
	"context"
	"sync"
)

// Queue is the local queue of one process, per lock key.
type Queue[H any] struct {
	mu    sync.Mutex
	lines map[string]*line[H]
}

type line[H any] struct {
	busy    bool // a goroutine has the key's turn
	waiters []*waiter[H]
}

type waiter[H any] struct {
	turn chan Turn[H]
	who  any
}

// Turn is what a goroutine gets when its turn comes: the hold the previous
// owner passed on (Handed), or nothing, and then it takes the lock from the
// service itself.
type Turn[H any] struct {
	Hold   H
	Handed bool
}

// New returns an empty queue.
func New[H any]() *Queue[H] {
	return &Queue[H]{lines: make(map[string]*line[H])}
}

// Wait waits for key's turn in this process and returns it. When ctx ends
// first it returns ctx's cause, having left the queue; a turn that reached
// it at that very moment is given to giveBack (on this goroutine), which
// must pass it on or end it (Pass, Done) as an owner would.
func (q *Queue[H]) Wait(ctx context.Context, key string, giveBack func(Turn[H])) (Turn[H], error) {
	return q.WaitAs(ctx, key, nil, giveBack)
}

// WaitAs is Wait for a waiter that Claim reports as who.
func (q *Queue[H]) WaitAs(ctx context.Context, key string, who any, giveBack func(Turn[H])) (Turn[H], error) {
	q.mu.Lock()
	ln := q.lines[key]
	if ln == nil {
		ln = &line[H]{}
		q.lines[key] = ln
	}
	if !ln.busy {
		ln.busy = true
		q.mu.Unlock()
		return Turn[H]{}, nil
	}
	w := &waiter[H]{turn: make(chan Turn[H], 1), who: who}
	ln.waiters = append(ln.waiters, w)
	q.mu.Unlock()

	select {
	case t := <-w.turn:
		return t, nil
	case <-ctx.Done():
	}
	q.mu.Lock()
	removed := ln.remove(w)
	q.mu.Unlock()
	if !removed {
		// The turn was given to us as we gave up: it is ours to pass on.
		giveBack(<-w.turn)
	}
	return Turn[H]{}, context.Cause(ctx)
}

// Waiting reports how many goroutines wait behind key's owner.
func (q *Queue[H]) Waiting(key string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ln := q.lines[key]; ln != nil {
		return len(ln.waiters)
	}
	return 0
}

// Pass hands hold to the goroutine that has waited longest for key and
// reports true. With none waiting it reports false, and the turn stays
// with the caller, who releases the lock at the service and calls Done.
func (q *Queue[H]) Pass(key string, hold H) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	ln := q.lines[key]
	if ln == nil || len(ln.waiters) == 0 {
		return false
	}
	w := ln.pop()
	w.turn <- Turn[H]{Hold: hold, Handed: true}
	return true
}

// Claimed is a waiter that Claim took out of the line: the turn is the
// caller's until it calls Give, exactly once.
type Claimed[H any] struct {
	w *waiter[H]
}

// Who is what the waiter gave WaitAs.
func (c *Claimed[H]) Who() any { return c.w.who }

// Give ends the caller's turn and gives it to the claimed waiter. A waiter
// whose wait ended since the Claim still receives it, and gives it back
// (Wait's giveBack).
func (c *Claimed[H]) Give(t Turn[H]) { c.w.turn <- t }

// Claim takes the goroutine that has waited longest for key out of the line
// and returns it, or nil when none waits (the turn then stays with the
// caller, who ends it with Done). Between Claim and Give the caller still
// has the turn: a goroutine that queues meanwhile waits behind the claimed
// one.
func (q *Queue[H]) Claim(key string) *Claimed[H] {
	q.mu.Lock()
	defer q.mu.Unlock()
	ln := q.lines[key]
	if ln == nil || len(ln.waiters) == 0 {
		return nil
	}
	return &Claimed[H]{w: ln.pop()}
}

// Done ends the caller's turn without passing a hold: the next waiter, if
// any, takes the lock from the service itself.
func (q *Queue[H]) Done(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ln := q.lines[key]
	if ln == nil {
		return
	}
	if len(ln.waiters) == 0 {
		// Nobody waits: forget the key, so that a process that locks many
		// keys keeps no state for the idle ones.
		delete(q.lines, key)
		return
	}
	ln.pop().turn <- Turn[H]{}
}

func (ln *line[H]) pop() *waiter[H] {
	w := ln.waiters[0]
	ln.waiters[0] = nil
	ln.waiters = ln.waiters[1:]
	return w
}

func (ln *line[H]) remove(w *waiter[H]) bool {
	for i, x := range ln.waiters {
		if x == w {
			ln.waiters = append(ln.waiters[:i], ln.waiters[i+1:]...)
			return true
		}
	}
	return false
}
