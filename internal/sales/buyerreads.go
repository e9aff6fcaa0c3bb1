package sales

import (
	"context"
	"fmt"
	"sync"
)

// buyerReads reads buyers' units (PER_USER_LIMIT) for the sold-out mark,
// one SKU's concurrent lookups in one statement: while a read of a SKU is
// in flight, the lookups of that SKU that arrive queue, and when it ends
// they become the next read, run by one of them (group commit, for reads).
// A sale's sold-out answers come all at once from every buyer who missed
// out, each needing its own count; one read apiece cost the database a
// round trip per refusal, which the mark exists to spare.
//
// No goroutine of its own: a read runs in the goroutine of one of the
// lookups it answers, and the next is handed to one of its own lookups.
type buyerReads struct {
	read func(ctx context.Context, sku string, userIDs []string) (map[string]int64, error)

	mu    sync.Mutex
	bySKU map[string]*skuReads
	// queued, when set (tests), is called with the lock held once a
	// lookup has joined a read that waits for its turn.
	queued func(sku string)
}

// skuReads is a SKU's read in flight and the lookups queued behind it.
type skuReads struct {
	next *unitsRead // nil when none is queued
}

// unitsRead is one read: the buyers it looks up and, once done is closed,
// its answer. turn is closed when it may run; the first of its lookups to
// see that (claimed) runs it.
type unitsRead struct {
	users   []string
	turn    chan struct{}
	claimed bool
	done    chan struct{}
	units   map[string]int64
	err     error
}

func newBuyerReads(read func(ctx context.Context, sku string, userIDs []string) (map[string]int64, error)) *buyerReads {
	return &buyerReads{read: read, bySKU: map[string]*skuReads{}}
}

// unitsOf returns the units userID holds or has paid for in sku's sale, as
// one read of the SKU's lookups in flight together finds them. ctx bounds
// the wait, and the read when this lookup is the one that runs it (the
// others it answers then get its error, and ask the store).
//
// A lookup that gives up leaves its read to the others; when none is left
// to run a read whose turn came, the next lookup of the SKU joins it and
// runs it at once.
func (b *buyerReads) unitsOf(ctx context.Context, sku, userID string) (int64, error) {
	b.mu.Lock()
	s, busy := b.bySKU[sku]
	if !busy {
		s = &skuReads{}
		b.bySKU[sku] = s
	}
	r := s.next
	if r == nil || !busy {
		r = &unitsRead{turn: make(chan struct{}), done: make(chan struct{})}
		if busy {
			s.next = r
		} else {
			// Nothing in flight: this lookup reads at once.
			close(r.turn)
		}
	}
	r.users = append(r.users, userID)
	if busy && b.queued != nil {
		b.queued(sku)
	}
	b.mu.Unlock()

	select {
	case <-r.done:
	case <-ctx.Done():
		return 0, fmt.Errorf("waiting for the buyers' units of %q: %w", sku, context.Cause(ctx))
	case <-r.turn:
		b.mu.Lock()
		run := !r.claimed
		r.claimed = true
		if run && s.next == r {
			s.next = nil // later lookups queue behind it
		}
		b.mu.Unlock()
		if run {
			b.run(ctx, sku, s, r)
		}
		select {
		case <-r.done:
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for the buyers' units of %q: %w", sku, context.Cause(ctx))
		}
	}
	return r.units[userID], r.err
}

// run reads r, answers its lookups, and hands the SKU to the read queued
// meanwhile, or leaves it idle; also when the read panics, which it
// answers as an error (the orders then ask the store), so that no lookup
// of the SKU waits for a read nobody runs.
func (b *buyerReads) run(ctx context.Context, sku string, s *skuReads, r *unitsRead) {
	defer func() {
		if p := recover(); p != nil {
			r.units, r.err = nil, fmt.Errorf("reading the buyers' units of %q: panic: %v", sku, p)
		}
		close(r.done)
		b.mu.Lock()
		defer b.mu.Unlock()
		if next := s.next; next != nil {
			close(next.turn)
			return
		}
		delete(b.bySKU, sku)
	}()
	r.units, r.err = b.read(ctx, sku, r.users)
}
