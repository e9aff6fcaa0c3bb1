package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/locked"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/explore"
	"github.com/flashsale/stock/lab/testdb"
)

// holder is one lock holder's transaction, driven a step at a time: it reads
// the stock row, and on "write" it writes only if its read showed the unit
// and a fence below its token (as the lock strategy decides), with the
// version it read, then commits.
type holder struct {
	name    string
	token   int64
	next    chan struct{} // the test's go-ahead for the next step
	read    chan inventory.Level
	written chan struct{} // the UPDATE ran; the COMMIT waits for next
	result  chan holderResult
	session chan int64
}

type holderResult struct {
	applied bool
	err     error
}

// startHolder opens the holder's transaction on a goroutine of its own.
// With commitApart, the write step stops after the UPDATE and the commit
// is one step more.
func startHolder(ctx context.Context, db store.Store, sku, name string, token int64, commitApart bool) *holder {
	h := &holder{name: name, token: token, next: make(chan struct{}), read: make(chan inventory.Level, 1),
		written: make(chan struct{}, 1), result: make(chan holderResult, 1), session: make(chan int64, 1)}
	go func() {
		var applied bool
		err := db.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
			if s, ok := tx.(interface {
				SessionID(context.Context) (int64, error)
			}); ok {
				id, err := s.SessionID(ctx)
				if err != nil {
					return err
				}
				h.session <- id
			}
			<-h.next
			level, err := tx.ReadLevel(ctx, sku)
			if err != nil {
				return err
			}
			h.read <- level
			<-h.next
			if level.Available < 1 || level.Fence >= token {
				return nil // sold out, or overtaken: nothing to write
			}
			if applied, err = tx.DeductIfFenced(ctx, sku, 1, token, level.Version); err != nil {
				return err
			}
			if commitApart {
				h.written <- struct{}{}
				<-h.next
			}
			return nil
		})
		h.result <- holderResult{applied: applied, err: err}
	}()
	return h
}

func (h *holder) doRead(t *testing.T) inventory.Level {
	t.Helper()
	h.next <- struct{}{}
	return <-h.read
}

func (h *holder) doWrite(t *testing.T) holderResult {
	t.Helper()
	h.next <- struct{}{}
	r := <-h.result
	if r.err != nil {
		t.Fatalf("%s's write: %v", h.name, r.err)
	}
	return r
}

// TestFencedWriteRefusesAStaleRead drives two lock holders' transactions
// through every order of {A reads, B reads, A writes, B writes} on both
// engines, with one unit left: A holds token base+1 and lost its lock
// unseen, B holds base+2. Whatever the order, exactly the first holder to
// write with a current read applies; the other's write is refused by the
// version it read or by the fence, and the stock ends at 0, never −1.
func TestFencedWriteRefusesAStaleRead(t *testing.T) {
	orders := [][]string{
		{"A reads", "B reads", "A writes", "B writes"},
		{"A reads", "B reads", "B writes", "A writes"},
		{"A reads", "A writes", "B reads", "B writes"},
		{"B reads", "A reads", "A writes", "B writes"},
		{"B reads", "A reads", "B writes", "A writes"},
		{"B reads", "B writes", "A reads", "A writes"},
	}
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, engine, 4)
			for i, order := range orders {
				t.Run(strings.Join(order, ", "), func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					sku := fmt.Sprintf("stale-%d", i)
					if err := db.StartSale(ctx, sku, 1); err != nil {
						t.Fatal(err)
					}
					base, err := db.Audit(ctx, sku)
					if err != nil {
						t.Fatal(err)
					}
					fence := fenceOf(ctx, t, db, sku)
					holders := map[string]*holder{
						"A": startHolder(ctx, db, sku, "A", fence+1, false),
						"B": startHolder(ctx, db, sku, "B", fence+2, false),
					}
					applied := map[string]bool{}
					var firstWriter string
					for _, step := range order {
						who, what, _ := strings.Cut(step, " ")
						h := holders[who]
						if what == "reads" {
							h.doRead(t)
							continue
						}
						if firstWriter == "" {
							firstWriter = who
						}
						applied[who] = h.doWrite(t).applied
					}
					// The first writer's read is always current: it
					// applies. The second's never is, once the first wrote.
					if !applied[firstWriter] || applied["A"] == applied["B"] {
						t.Errorf("applied %v, want only %s's write", applied, firstWriter)
					}
					a, err := db.Audit(ctx, sku)
					if err != nil {
						t.Fatal(err)
					}
					if a.Available != 0 || a.Initial != base.Initial {
						t.Errorf("available %d of %d, want 0", a.Available, a.Initial)
					}
				})
			}
		})
	}
}

// TestFencedWriteAfterAnUnknownCommit is the schedule that needs no pause:
// A's UPDATE has run and its COMMIT is in flight (its order gave up and
// released the lock); B takes the lock, reads the old level, and its UPDATE
// queues on A's row lock. When A's COMMIT lands, B's UPDATE finds the row
// at another version than the one B read, and changes nothing.
func TestFencedWriteAfterAnUnknownCommit(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			url := testdb.URL(t, engine)
			db, err := store.Open(ctx, url, 4)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(db.Close)
			if err := db.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			waits, err := explore.ObserveWaits(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(waits.Close)

			const sku = "unknown-commit"
			if err := db.StartSale(ctx, sku, 1); err != nil {
				t.Fatal(err)
			}
			fence := fenceOf(ctx, t, db, sku)
			a := startHolder(ctx, db, sku, "A", fence+1, true)
			a.doRead(t)
			a.next <- struct{}{}
			<-a.written // A's UPDATE holds the row; its COMMIT waits

			b := startHolder(ctx, db, sku, "B", fence+2, false)
			bSession := <-b.session
			if level := b.doRead(t); level.Available != 1 {
				t.Fatalf("B read %d available, want the old level 1", level.Available)
			}
			b.next <- struct{}{} // B's UPDATE: it must queue on A's row lock
			for {
				blocked, err := waits.Blocked(ctx, bSession)
				if err != nil {
					t.Fatal(err)
				}
				if blocked {
					break
				}
			}
			a.next <- struct{}{} // A's COMMIT lands
			if r := <-a.result; r.err != nil || !r.applied {
				t.Fatalf("A: applied %v, %v; want its write committed", r.applied, r.err)
			}
			if r := <-b.result; r.err != nil || r.applied {
				t.Errorf("B: applied %v, %v; want its stale write refused", r.applied, r.err)
			}
			au, err := db.Audit(ctx, sku)
			if err != nil {
				t.Fatal(err)
			}
			if au.Available != 0 {
				t.Errorf("available %d, want 0", au.Available)
			}
		})
	}
}

// fenceOf reads the row's fence as the sale left it: tokens only grow, so
// the holders' tokens must lie above it.
func fenceOf(ctx context.Context, t *testing.T, db store.Store, sku string) int64 {
	t.Helper()
	var fence int64
	err := db.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
		level, err := tx.ReadLevel(ctx, sku)
		fence = level.Fence
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return fence
}

// lostLeaseLocker grants one lease whose context the test ends, as the
// watchdog does when it finds the lock lost.
type lostLeaseLocker struct{ end context.CancelFunc }

func (l *lostLeaseLocker) Acquire(ctx context.Context, _ string) (locked.Lease, error) {
	leaseCtx, end := context.WithCancel(ctx)
	l.end = end
	return lostLease{ctx: leaseCtx}, nil
}
func (*lostLeaseLocker) Reset(context.Context, string) error               { return nil }
func (*lostLeaseLocker) ResetAll(context.Context, []string) error          { return nil }
func (*lostLeaseLocker) AdvanceFence(context.Context, string, int64) error { return nil }

type lostLease struct{ ctx context.Context }

func (lostLease) Token() int64                  { return 1 }
func (l lostLease) Context() context.Context    { return l.ctx }
func (lostLease) Release(context.Context) error { return nil }

// afterInsert calls its hook once the order row is written, inside the
// order's transaction, before the commit.
type afterInsert struct {
	store.Store
	hook func()
}

func (s afterInsert) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	return s.Store.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
		return fn(ctx, afterInsertTx{tx, s.hook})
	})
}

type afterInsertTx struct {
	inventory.Tx
	hook func()
}

func (t afterInsertTx) InsertOrder(ctx context.Context, o inventory.Order) (time.Time, error) {
	expires, err := t.Tx.InsertOrder(ctx, o)
	t.hook()
	return expires, err
}

// TestLeaseLostBeforeCommit: the watchdog ends the lease after the write and
// the order insert, before the COMMIT. Nothing is committed, and the buyer is
// told busy on both engines — not "outcome unknown", which MySQL's adapter
// answered when database/sql refused the commit of a cancelled transaction
// (found by review).
func TestLeaseLostBeforeCommit(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, engine, 4)
			l := &lostLeaseLocker{}
			svc := sales.NewService(afterInsert{db, func() { l.end() }}, locked.New(strategies.NameRedisLock, l))
			if err := svc.StartSale(ctx, "lease-lost", 1); err != nil {
				t.Fatal(err)
			}
			_, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "lease-lost", Quantity: 1, UserID: "u"})
			a, aerr := db.Audit(ctx, "lease-lost")
			if aerr != nil {
				t.Fatal(aerr)
			}
			if a.Available != 1 || a.Orders != 0 {
				t.Fatalf("the order was committed after its lease ended: %+v", a)
			}
			if got := inventory.Outcome(err); got != "busy" {
				t.Errorf("nothing was committed, yet the answer is %q: %v", got, err)
			}
		})
	}
}
