package explore

import (
	"context"
	"fmt"
	"sync"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
)

// Reservations is what the explorer needs to run a strategy that takes
// orders into a reservation store (redis-reserve): the real store, the
// database's side of it, and a writer that moves one batch of accepted
// orders from the store into the database per call (the strategy's
// consumer, run when the scheduler says instead of on its own).
type Reservations struct {
	Store reservation.Reservations
	Sales reservation.EpochSales
	Write func(ctx context.Context, sku string) (int, error)
}

// stepReserve is a buyer's one call into the reservation store: an atomic
// script, so one step. stepWriteOrders is one batch of the writer.
const (
	stepReserve     = "reserve"
	stepWriteOrders = "write a batch"
)

// reservations parks a buyer before each call that takes stock, notes the
// order it tries (so a refused buyer's order can be looked for), and lets
// the scheduler lose the call's answer: the script ran, the buyer hears
// "outcome unknown".
type reservations struct {
	reservation.Reservations
	st *store
	w  *writer
}

func (r *reservations) Reserve(ctx context.Context, res reservation.Reservation) (reservation.Taken, error) {
	e := entityOf(ctx)
	if e == nil {
		return r.Reservations.Reserve(ctx, res)
	}
	g := r.st.s.park(e, stepReserve, 0)
	if g.abort {
		return reservation.Taken{}, errAborted
	}
	r.st.noteInsert(e.buyer, res.Order.ID)
	taken, err := r.Reservations.Reserve(ctx, res)
	if err == nil && taken.OrderID == res.Order.ID && r.w != nil {
		r.w.accepted()
	}
	if g.loseAnswer {
		return reservation.Taken{}, fmt.Errorf("%w: %w", inventory.ErrOutcomeUnknown, errLostAnswer)
	}
	return taken, err
}

// writer is the entity that moves accepted orders into the database. It
// asks for a step only while there are orders to move, and finishes once
// every buyer is done and nothing is left.
type writer struct {
	s     *scheduler
	e     *entity
	write func(ctx context.Context, sku string) (int, error)
	kick  chan struct{}

	mu         sync.Mutex
	unwritten  int
	buyersLeft int
	sleeping   bool
	err        error
}

func newWriter(s *scheduler, write func(context.Context, string) (int, error), buyers int) *writer {
	return &writer{s: s, e: s.newEntity("W", -1), write: write, kick: make(chan struct{}, 1), buyersLeft: buyers}
}

// accepted is called by a buyer, inside its step, for an order the store
// took; buyerDone by a buyer's goroutine before it reports itself done.
func (w *writer) accepted()  { w.change(func() { w.unwritten++ }) }
func (w *writer) buyerDone() { w.change(func() { w.buyersLeft-- }) }

// change updates the counts and wakes the writer if it sleeps: the wake-up
// is announced before the caller's next step, as the scheduler requires.
func (w *writer) change(f func()) {
	w.mu.Lock()
	f()
	wake := w.sleeping
	w.sleeping = false
	w.mu.Unlock()
	if wake {
		w.s.wake(w.e)
		w.kick <- struct{}{}
	}
}

// run is the writer's goroutine.
func (w *writer) run(ctx context.Context, sku string) {
	defer func() { w.s.events <- event{e: w.e, kind: evDone} }()
	for {
		w.mu.Lock()
		switch {
		case w.unwritten > 0:
			w.mu.Unlock()
		case w.buyersLeft == 0:
			w.mu.Unlock()
			return
		default:
			w.sleeping = true
			w.mu.Unlock()
			w.s.sleep(w.e)
			<-w.kick
			continue
		}
		if w.s.park(w.e, stepWriteOrders, 0).abort {
			return
		}
		n, err := w.write(ctx, sku)
		w.mu.Lock()
		w.unwritten -= n
		if err != nil || n == 0 {
			// Nothing moved although orders were accepted: the writer
			// could never finish; the check reports it.
			w.err = fmt.Errorf("the writer moved %d orders with %d unwritten: %v", n, w.unwritten+n, err)
			w.unwritten = 0
		}
		w.mu.Unlock()
	}
}
