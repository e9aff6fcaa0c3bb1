// Package keygate lets at most n callers per key in at once, in one
// process: the per-SKU bound of the row strategies (inventory.RowGated),
// of optimistic compare-and-set attempts (sqlrow.VersionCAS) and of
// WATCH attempts (reservation's redis-watch).
//
// A key's semaphore exists only while someone holds or waits for it, so a
// catalog of a million SKUs costs memory in proportion to the requests in
// flight, not to the SKUs ever seen, and two keys never share a semaphore:
// one hot SKU cannot hold up another (a fixed set of hashed stripes would
// make two hot SKUs that share a stripe queue behind each other).
package keygate

import (
	"context"
	"sync"
)

// Gate lets at most n holders per key in at once. The zero Gate is not
// usable: make one with New.
type Gate struct {
	n     int
	mu    sync.Mutex
	slots map[string]*slot
}

type slot struct {
	sem  chan struct{}
	refs int // holders and waiters, under Gate.mu
}

// New returns a Gate of n places per key; n < 1 is taken as 1.
func New(n int) *Gate {
	return &Gate{n: max(1, n), slots: map[string]*slot{}}
}

// Enter waits for one of key's places, or until ctx ends (then it returns
// context.Cause(ctx)), and returns the function that gives the place back.
func (g *Gate) Enter(ctx context.Context, key string) (leave func(), err error) {
	g.mu.Lock()
	s := g.slots[key]
	if s == nil {
		s = &slot{sem: make(chan struct{}, g.n)}
		g.slots[key] = s
	}
	s.refs++
	g.mu.Unlock()

	var once sync.Once
	leave = func() {
		once.Do(func() {
			<-s.sem
			g.forget(key, s)
		})
	}
	// A free place is taken even if ctx has ended meanwhile: select would
	// pick between the two at random.
	select {
	case s.sem <- struct{}{}:
		return leave, nil
	default:
	}
	select {
	case s.sem <- struct{}{}:
		return leave, nil
	case <-ctx.Done():
		g.forget(key, s)
		return nil, context.Cause(ctx)
	}
}

// Keys is the number of keys held or waited for now (what the Gate keeps
// in memory).
func (g *Gate) Keys() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.slots)
}

func (g *Gate) forget(key string, s *slot) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s.refs--; s.refs == 0 {
		delete(g.slots, key)
	}
}
