package explore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/locked"
)

// store wraps the real store: every transaction of a buyer runs on a
// goroutine of its own and parks before each statement that touches shared
// rows and before its commit, so the scheduler decides what runs when. Calls
// from outside a buyer (setting up the sale, the audit) pass straight
// through.
type store struct {
	inventory.Store
	s *scheduler

	mu       sync.Mutex
	inserted map[int][]string // buyer -> ids of the orders it tried to insert
	// byUser: user_id -> ids of the orders tried for it, whoever inserted
	// them (a batch's leader inserts the others'; buyers may share one).
	byUser map[string][]string
	// returned: buyer -> units that its committed transactions gave back
	// (ReturnUnits, ReturnEach), the late commits of its lost answers included.
	returned map[int]int64
}

func newStore(db inventory.Store, s *scheduler) *store {
	return &store{Store: db, s: s, inserted: map[int][]string{}, byUser: map[string][]string{}, returned: map[int]int64{}}
}

var (
	_ inventory.Store = (*store)(nil)
	_ inventory.Tx    = (*tx)(nil)
	_ locked.Locker   = (*locker)(nil)
	_ locked.Lease    = (*lease)(nil)
)

// sessioner is implemented by the adapters' transactions: the server's id
// of the connection, to ask the server whether it waits for a lock.
type sessioner interface {
	SessionID(ctx context.Context) (int64, error)
}

// InTx runs the buyer's transaction on a goroutine of its own, so that a
// commit whose answer is lost can tell the buyer "unknown" at once and
// commit later, when the scheduler says: as a COMMIT still in flight when
// its order gave up would.
func (st *store) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	e := entityOf(ctx)
	if e == nil {
		return st.Store.InTx(ctx, fn)
	}
	return runTx(ctx, st, e, st.Store.InTx, func(inner inventory.Tx, stp *stepper) inventory.Tx {
		return &tx{Tx: inner, stepper: stp}
	}, fn)
}

// InBatchTx is InTx for a strategy that owns its transaction (batched).
func (st *store) InBatchTx(ctx context.Context, fn func(context.Context, batched.Tx) error) error {
	batches, ok := st.Store.(batched.Store)
	if !ok {
		return errors.New("explore: the store does not run batch transactions")
	}
	e := entityOf(ctx)
	if e == nil {
		return batches.InBatchTx(ctx, fn)
	}
	return runTx(ctx, st, e, batches.InBatchTx, func(inner batched.Tx, stp *stepper) batched.Tx {
		return &batchTx{Tx: inner, stepper: stp}
	}, fn)
}

// errLostAnswer is what a transaction whose commit answer the scheduler
// lost reports: every order it carried (a batch's, too) may be told
// "unavailable" for it.
var errLostAnswer = errors.New("explore: the scheduler lost the commit's answer")

// runTx runs one transaction of entity e through begin, its statements
// wrapped so that they park (wrap), and parks it before its commit.
func runTx[T any](ctx context.Context, st *store, e *entity,
	begin func(context.Context, func(context.Context, T) error) error,
	wrap func(T, *stepper) T, fn func(context.Context, T) error,
) error {
	answer := make(chan error, 2)
	go func() {
		owner := e
		var stp *stepper
		// The transaction outlives the buyer's context when its answer is
		// lost; the scheduler, not a deadline, decides when it ends.
		err := begin(context.WithoutCancel(ctx), func(txCtx context.Context, inner T) error {
			stp = &stepper{st: st, e: e, inner: inner}
			if err := fn(txCtx, wrap(inner, stp)); err != nil {
				return err
			}
			g := st.s.park(e, stepCommit, stp.session)
			if g.abort {
				return errAborted
			}
			if !g.loseAnswer {
				return nil
			}
			answer <- fmt.Errorf("%w: %w", inventory.ErrOutcomeUnknown, errLostAnswer)
			owner = g.late
			if st.s.park(g.late, stepLateCommit, stp.session).abort {
				return errAborted
			}
			return nil
		})
		if err == nil && stp != nil {
			// Committed: what it gave back is back.
			st.noteReturned(e.buyer, stp.returned)
		}
		if owner != e {
			st.s.events <- event{e: owner, kind: evDone}
			return
		}
		st.s.events <- event{e: e, kind: evSessionEnd}
		answer <- err
	}()
	return <-answer
}

// FindOrder is a step: whether a late commit has landed yet depends on the
// schedule.
func (st *store) FindOrder(ctx context.Context, id string) (inventory.Order, bool, error) {
	if e := entityOf(ctx); e != nil && st.s.park(e, stepFindOrder, 0).abort {
		return inventory.Order{}, false, errAborted
	}
	return st.Store.FindOrder(ctx, id)
}

func (st *store) noteInsert(buyer int, id string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.inserted[buyer] = append(st.inserted[buyer], id)
}

func (st *store) noteUserInsert(user, id string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.byUser[user] = append(st.byUser[user], id)
}

func (st *store) noteReturned(buyer int, units int64) {
	if units == 0 {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.returned[buyer] += units
}

// stepper parks an entity's transaction before a statement.
type stepper struct {
	st      *store
	e       *entity
	inner   any // the adapter's transaction, which tells its session
	session int64
	// returned counts the units the transaction gave back so far.
	returned int64
}

func (t *stepper) step(ctx context.Context, name string) error {
	if t.session == 0 {
		s, ok := t.inner.(sessioner)
		if !ok {
			return errors.New("explore: the store's transactions do not tell their session")
		}
		id, err := s.SessionID(ctx)
		if err != nil {
			return err
		}
		t.session = id
	}
	if t.st.s.park(t.e, name, t.session).abort {
		return errAborted
	}
	return nil
}

// tx parks before each statement on the stock row or an idempotency key, and
// lets the order insert (a row of its own, under a fresh id) run on.
type tx struct {
	inventory.Tx
	*stepper
}

func (t *tx) ReadLevel(ctx context.Context, sku string) (inventory.Level, error) {
	if err := t.step(ctx, stepRead); err != nil {
		return inventory.Level{}, err
	}
	return t.Tx.ReadLevel(ctx, sku)
}

func (t *tx) LockLevel(ctx context.Context, sku string) (inventory.Level, error) {
	if err := t.step(ctx, stepLockRead); err != nil {
		return inventory.Level{}, err
	}
	return t.Tx.LockLevel(ctx, sku)
}

func (t *tx) Deduct(ctx context.Context, sku string, quantity int64) error {
	if err := t.step(ctx, stepWrite); err != nil {
		return err
	}
	return t.Tx.Deduct(ctx, sku, quantity)
}

func (t *tx) DeductIfVersion(ctx context.Context, sku string, quantity, version int64) (bool, error) {
	if err := t.step(ctx, stepWrite); err != nil {
		return false, err
	}
	return t.Tx.DeductIfVersion(ctx, sku, quantity, version)
}

func (t *tx) DeductIfAvailable(ctx context.Context, sku string, quantity int64) (bool, error) {
	if err := t.step(ctx, stepWrite); err != nil {
		return false, err
	}
	return t.Tx.DeductIfAvailable(ctx, sku, quantity)
}

func (t *tx) DeductIfFenced(ctx context.Context, sku string, quantity, token, readVersion int64) (bool, error) {
	if err := t.step(ctx, stepWrite); err != nil {
		return false, err
	}
	return t.Tx.DeductIfFenced(ctx, sku, quantity, token, readVersion)
}

// SettleOrder, ReturnUnits and ExpireLapsed are the lifecycle's writes:
// each takes the order's or the stock's row lock, and which of two racing
// transitions gets it first is what the schedules of the lifecycle are
// about.
func (t *tx) SettleOrder(ctx context.Context, id, userID, to string) (bool, error) {
	if err := t.step(ctx, stepSettle+" "+to); err != nil {
		return false, err
	}
	return t.Tx.SettleOrder(ctx, id, userID, to)
}

func (t *tx) ReturnUnits(ctx context.Context, sku string, quantity int64) error {
	if err := t.step(ctx, stepReturn); err != nil {
		return err
	}
	if err := t.Tx.ReturnUnits(ctx, sku, quantity); err != nil {
		return err
	}
	t.returned += quantity
	return nil
}

// ReturnEach is one statement (the sweep's): one step, as ReturnUnits;
// none when it has nothing to return (no statement runs).
func (t *tx) ReturnEach(ctx context.Context, returns []inventory.Order) error {
	if len(returns) == 0 {
		return nil
	}
	if err := t.step(ctx, stepReturn); err != nil {
		return err
	}
	if err := t.Tx.ReturnEach(ctx, returns); err != nil {
		return err
	}
	for _, r := range returns {
		t.returned += r.Quantity
	}
	return nil
}

func (t *tx) ExpireLapsed(ctx context.Context, limit int) ([]inventory.Order, error) {
	if err := t.step(ctx, stepSweep); err != nil {
		return nil, err
	}
	return t.Tx.ExpireLapsed(ctx, limit)
}

// ClaimUnits takes the buyer's row lock (PER_USER_LIMIT): two orders of
// one buyer queue there, and which claims first is the race of the
// per-user limit. ReleaseUnits and ReleaseEach run on: they follow the
// move of the order out of held (SettleOrder, ExpireLapsed: steps), which
// decides the race they end.
func (t *tx) ClaimUnits(ctx context.Context, sku, userID string, quantity, limit int64) (bool, error) {
	if err := t.step(ctx, stepClaim); err != nil {
		return false, err
	}
	return t.Tx.ClaimUnits(ctx, sku, userID, quantity, limit)
}

// ResolveOrder is a step that takes a share lock on the stock row: it
// waits for a late commit (another entity) to land or roll back.
func (t *tx) ResolveOrder(ctx context.Context, sku, id string) (inventory.Order, bool, error) {
	if err := t.step(ctx, stepResolve); err != nil {
		return inventory.Order{}, false, err
	}
	return t.Tx.ResolveOrder(ctx, sku, id)
}

func (t *tx) InsertOrder(ctx context.Context, o inventory.Order) (time.Time, error) {
	t.st.noteInsert(t.e.buyer, o.ID)
	t.st.noteUserInsert(o.UserID, o.ID)
	return t.Tx.InsertOrder(ctx, o)
}

// batchTx is tx for the transaction of a batch, which the batch's leader
// runs for every order in it.
type batchTx struct {
	batched.Tx
	*stepper
}

func (t *batchTx) DeductIfAvailable(ctx context.Context, sku string, total int64) (bool, error) {
	if err := t.step(ctx, stepWrite); err != nil {
		return false, err
	}
	return t.Tx.DeductIfAvailable(ctx, sku, total)
}

func (t *batchTx) DeductEach(ctx context.Context, skus []string, totals []int64) ([]batched.Deduction, error) {
	if err := t.step(ctx, stepWrite); err != nil {
		return nil, err
	}
	return t.Tx.DeductEach(ctx, skus, totals)
}

func (t *batchTx) DeductEachSkippingHeld(ctx context.Context, skus []string, totals []int64) ([]batched.Deduction, error) {
	if err := t.step(ctx, stepWrite); err != nil {
		return nil, err
	}
	return t.Tx.DeductEachSkippingHeld(ctx, skus, totals)
}

func (t *batchTx) LockLevel(ctx context.Context, sku string) (inventory.Level, error) {
	if err := t.step(ctx, stepLockRead); err != nil {
		return inventory.Level{}, err
	}
	return t.Tx.LockLevel(ctx, sku)
}

func (t *batchTx) FindIdempotencyKeys(ctx context.Context, keys []string) (map[string]inventory.IdempotencyRecord, error) {
	if err := t.step(ctx, stepIdemRead); err != nil {
		return nil, err
	}
	return t.Tx.FindIdempotencyKeys(ctx, keys)
}

func (t *batchTx) InsertIdempotencyRecords(ctx context.Context, records []inventory.IdempotencyRecord) (int, error) {
	if err := t.step(ctx, stepIdemWrite); err != nil {
		return 0, err
	}
	return t.Tx.InsertIdempotencyRecords(ctx, records)
}

// ClaimFirstUnits, LockBuyers, ClaimUnitsOf and ReleaseUnitsOf are the
// batch's statements on its buyers' rows (PER_USER_LIMIT): the first waits
// for another transaction inserting the same buyer, the others lock rows
// that exist.
func (t *batchTx) ClaimFirstUnits(ctx context.Context, sku string, claims map[string]int64) ([]string, error) {
	if err := t.step(ctx, stepClaim); err != nil {
		return nil, err
	}
	return t.Tx.ClaimFirstUnits(ctx, sku, claims)
}

func (t *batchTx) ReleaseUnitsOf(ctx context.Context, sku string, units map[string]int64) error {
	if err := t.step(ctx, stepClaim); err != nil {
		return err
	}
	return t.Tx.ReleaseUnitsOf(ctx, sku, units)
}

func (t *batchTx) LockBuyers(ctx context.Context, sku string, userIDs []string) (map[string]int64, error) {
	if err := t.step(ctx, stepLockRead); err != nil {
		return nil, err
	}
	return t.Tx.LockBuyers(ctx, sku, userIDs)
}

func (t *batchTx) ClaimUnitsOf(ctx context.Context, sku string, claims, held map[string]int64, limit int64) (bool, error) {
	if err := t.step(ctx, stepClaim); err != nil {
		return false, err
	}
	return t.Tx.ClaimUnitsOf(ctx, sku, claims, held, limit)
}

// ResolveOrder is tx's, for a batch whose commit answer was lost.
func (t *batchTx) ResolveOrder(ctx context.Context, sku, id string) (inventory.Order, bool, error) {
	if err := t.step(ctx, stepResolve); err != nil {
		return inventory.Order{}, false, err
	}
	return t.Tx.ResolveOrder(ctx, sku, id)
}

// InsertOrders notes each order under its buyer: the batch's leader
// inserts the others' orders too. Buyers are told apart by user id
// ("buyer-A"); in a retry scenario they share one, and none is noted.
func (t *batchTx) InsertOrders(ctx context.Context, orders []inventory.Order) ([]time.Time, error) {
	for _, o := range orders {
		t.st.noteUserInsert(o.UserID, o.ID)
		if name, ok := strings.CutPrefix(o.UserID, "buyer-"); ok && len(name) == 1 {
			t.st.noteInsert(int(name[0]-'A'), o.ID)
		}
	}
	return t.Tx.InsertOrders(ctx, orders)
}

// queue tells the scheduler of buyers that wait in the process for a
// batch's leader (batched.QueueObserver). A buyer joins its SKU's queue
// only when the scheduler says: whether it lands in the batch being formed
// or in the next one is a choice of the schedule, not of the Go runtime.
type queue struct{ s *scheduler }

func (q queue) Joining(ctx context.Context) {
	if e := entityOf(ctx); e != nil {
		q.s.park(e, stepJoin, 0)
	}
}

func (q queue) Waiting(ctx context.Context) {
	if e := entityOf(ctx); e != nil {
		q.s.sleep(e)
	}
}

func (q queue) Woken(ctx context.Context) {
	if e := entityOf(ctx); e != nil {
		q.s.wake(e)
	}
}

func (t *tx) FindIdempotency(ctx context.Context, key string) (inventory.IdempotencyRecord, bool, error) {
	if err := t.step(ctx, stepIdemRead); err != nil {
		return inventory.IdempotencyRecord{}, false, err
	}
	return t.Tx.FindIdempotency(ctx, key)
}

func (t *tx) InsertIdempotency(ctx context.Context, r inventory.IdempotencyRecord) (bool, error) {
	if err := t.step(ctx, stepIdemWrite); err != nil {
		return false, err
	}
	return t.Tx.InsertIdempotency(ctx, r)
}

// locker is the lock as the scheduler models it: one holder at a time, a
// token that grows with every holder, and an expiry the scheduler may fire
// at any step of the holder — which the holder does not hear of, as when it
// is paused. The real backends (internal/locking/..., through the conformance suite internal/locking/locktest) are held to that contract
// by their own tests; here it is the write under the lock that is on trial.
type locker struct{ s *scheduler }

func (l *locker) Acquire(ctx context.Context, _ string) (locked.Lease, error) {
	e := entityOf(ctx)
	if e == nil {
		return nil, errors.New("explore: the lock is only for the buyers of a schedule")
	}
	g := l.s.park(e, stepAcquire, 0)
	if g.abort {
		return nil, errAborted
	}
	return &lease{l: l, e: e, ctx: ctx, token: g.token}, nil
}

// Reset and AdvanceFence touch no lock state the model keeps: its tokens
// only grow.
func (l *locker) Reset(context.Context, string) error               { return nil }
func (l *locker) ResetAll(context.Context, []string) error          { return nil }
func (l *locker) AdvanceFence(context.Context, string, int64) error { return nil }

type lease struct {
	l     *locker
	e     *entity
	ctx   context.Context
	token int64
}

func (le *lease) Token() int64             { return le.token }
func (le *lease) Context() context.Context { return le.ctx }
func (le *lease) Release(context.Context) error {
	if g := le.l.s.parkRelease(le.e, le.token); g.abort || !g.held {
		return errors.New("explore: the lock had expired")
	}
	return nil
}
