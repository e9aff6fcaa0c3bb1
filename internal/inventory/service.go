package inventory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/stock/internal/backoff"
)

// Service takes orders with one strategy over one store.
type Service struct {
	store      Store
	strategy   Strategy
	log        *slog.Logger
	timeout    time.Duration
	txAttempts int
	newID      func() string
	obs        Observer
	hold       time.Duration
	limit      int64
	// relay is the strategy's RelayReturns when it counts the stock
	// outside the database: returns are marked for it and relayed.
	relay func(ctx context.Context, sku string) (int, error)
	// soldOut refuses the orders of a SKU just refused sold out without
	// a round trip; nil when WithSoldOutTTL(0) turned it off.
	soldOut    *soldOutMarks
	soldOutTTL time.Duration
	now        func() time.Time
}

// ServiceOption configures a Service.
type ServiceOption func(*Service)

// WithOrderTimeout bounds the time one order may take, waits included; past
// it the order fails with ErrBusy and nothing is deducted. Default 3s.
func WithOrderTimeout(d time.Duration) ServiceOption {
	return func(s *Service) { s.timeout = d }
}

// WithTxAttempts bounds how often one transaction is run again after the
// database aborted it to resolve a conflict (deadlock, serialisation
// failure, lock wait timeout). Default 5.
func WithTxAttempts(n int) ServiceOption {
	return func(s *Service) { s.txAttempts = max(1, n) }
}

// WithLogger sets the logger. Default: slog.Default().
func WithLogger(l *slog.Logger) ServiceOption {
	return func(s *Service) { s.log = l }
}

// WithObserver sets who hears about orders and retries. Default:
// NopObserver.
func WithObserver(o Observer) ServiceOption {
	return func(s *Service) { s.obs = o }
}

// WithHoldTTL makes every new order held for d, on the database's clock,
// until its buyer pays or cancels it (PayOrder, CancelOrder); a hold that
// lapses gives its units back (ExpireHolds, or lazily when the order is
// read). Default 0: orders are final at once.
func WithHoldTTL(d time.Duration) ServiceOption {
	return func(s *Service) { s.hold = max(0, d) }
}

// WithPerUserLimit bounds the units one buyer (user_id) holds or has paid
// for per SKU and sale to n, across instances and strategies: the order's
// transaction claims them on the buyer's row (ClaimUnits) before it
// deducts, so the check cannot come after the decrement, and an order past
// the limit is ErrLimitReached with nothing changed. Cancelled and expired
// orders give their units back to the buyer too. Every instance of a sale
// should run with the same limit. Default 0: no limit.
func WithPerUserLimit(n int64) ServiceOption {
	return func(s *Service) { s.limit = max(0, n) }
}

// WithSoldOutTTL sets how long an order refused sold out lets this instance
// refuse the SKU's orders of as many units or more without asking the
// store: once a sale's units are gone, most of its orders are answered so,
// and the cheapest answer should be the one given most. It is also the
// bound on how long this instance may answer sold out to an order that
// units given back through another instance (a cancel, an expiry, a
// restock, a new sale) would cover; those given back through this
// instance lift the mark at once. The mark only refuses, so no order is
// ever let through that the stock does not cover; an order with an
// idempotency key always asks (a retry of an order taken gets its order).
// Default DefaultSoldOutTTL (1s); 0 turns the mark off.
func WithSoldOutTTL(d time.Duration) ServiceOption {
	return func(s *Service) { s.soldOutTTL = max(0, d) }
}

// WithClock sets the clock the sold-out mark's time is read from (only
// durations on it count, never its hour). Default time.Now; tests and the
// schedule explorer step their own.
func WithClock(now func() time.Time) ServiceOption {
	return func(s *Service) { s.now = now }
}

// NewService returns a Service.
//
// It panics on a strategy that breaks the contract (Strategy.Validate): a
// programming error, caught where the strategy is wired.
func NewService(store Store, strategic Strategic, opts ...ServiceOption) *Service {
	strategy := strategic.Strategy()
	if err := strategy.Validate(); err != nil {
		panic(err)
	}
	s := &Service{
		store:      store,
		strategy:   strategy,
		log:        slog.Default(),
		timeout:    3 * time.Second,
		txAttempts: 5,
		newID:      newOrderID,
		obs:        NopObserver{},
		soldOutTTL: DefaultSoldOutTTL,
		now:        time.Now,
	}
	for _, o := range opts {
		o(s)
	}
	if s.soldOutTTL > 0 {
		s.soldOut = newSoldOutMarks(s.soldOutTTL, s.now)
	}
	s.relay = strategy.RelayReturns
	return s
}

// newOrderID returns a UUIDv7: time-ordered, so order inserts append to the
// primary key index instead of splitting random pages.
func newOrderID() string {
	return uuid.Must(uuid.NewV7()).String()
}

// Strategy returns the name of the service's strategy.
func (s *Service) Strategy() string { return s.strategy.Name }

// Errors that steer the transaction runner; they never leave the package.
var (
	// errReplayed: the idempotency key has an order already.
	errReplayed = errors.New("idempotency key already answered")
	// errKeyTaken: a concurrent request with the same key committed first;
	// the next attempt finds its record and replays it.
	errKeyTaken = errors.New("idempotency key taken concurrently")
)

// PlaceOrder deducts req.Quantity units of req.SKU and records the order. With
// an idempotency key, a retry of the same request returns the first order and
// deducts nothing more; the same key with another request is
// ErrIdempotencyConflict.
func (s *Service) PlaceOrder(ctx context.Context, req Request) (Order, error) {
	began := time.Now()
	order, err := s.placeOrder(ctx, req)
	s.obs.OrderDone(s.strategy.Name, Outcome(err), time.Since(began))
	return order, err
}

func (s *Service) placeOrder(ctx context.Context, req Request) (Order, error) {
	if err := req.Validate(); err != nil {
		return Order{}, err
	}
	if s.limit > 0 && req.Quantity > s.limit {
		// No transaction: no order of this size can ever be taken (and
		// the answer says so, not sold out).
		return Order{}, s.limitReached(req)
	}
	sent := s.now()
	refused, probe := s.markAdmits(req)
	if probe != 0 {
		// Let through to renew the mark ahead of its end: its refusal
		// is noted below, and whatever its answer, the next order may
		// probe again.
		defer s.soldOut.probed(req.SKU, probe)
	}
	if refused {
		// Refused sold out a moment ago: refused again without asking.
		// Not with a key: a retry of an order that was taken must get its
		// order back, and only the strategy knows where the key is (the
		// reservation strategies' reach the database later). Before the
		// deadline's timer and the fingerprint: the answer given most in a
		// flash sale costs neither.
		return Order{}, s.soldOutError(req)
	}
	// Only a key's replay compares fingerprints: an order without one
	// (most of a flash sale's) skips the hash.
	var fingerprint []byte
	if req.IdempotencyKey != "" {
		fingerprint = req.fingerprint()
	}

	// The order runs to its own deadline even if the client hangs up: the
	// transaction is atomic either way, and finishing it keeps the logs and
	// the answer for a retry true.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()

	order := Order{
		ID:       s.newID(),
		SKU:      req.SKU,
		Quantity: req.Quantity,
		UserID:   req.UserID,
		Strategy: s.strategy.Name,
		State:    OrderFinal,
	}
	if s.hold > 0 {
		order.State, order.Hold = OrderHeld, s.hold
	}
	if s.limit > 0 {
		// Claimed on the buyer's count in the order's transaction
		// (ClaimUnits), and given back by its cancel or expiry.
		order.Claimed = order.Quantity
	}
	var replayed Order
	var err error
	if take := s.strategy.TakeOrder; take != nil {
		// The strategy owns the transaction (batched.Batched): it checks
		// the key, deducts, and records the order and its key itself.
		placed, terr := take(ctx, PendingOrder{Order: order, IdempotencyKey: req.IdempotencyKey, Fingerprint: fingerprint, PerUserLimit: s.limit,
			Mark: s.markFor(req, probe != 0)})
		if terr == nil && placed.ID != order.ID {
			replayed, terr = placed, errReplayed
		}
		order.ExpiresAt = placed.ExpiresAt
		err = terr
	} else {
		replayed, err = s.deduct(ctx, req, &order, fingerprint, probe != 0)
	}
	switch {
	case err == nil:
		// Guarded: slog boxes its arguments before it asks the level.
		if s.log.Enabled(ctx, slog.LevelDebug) {
			s.log.Debug("order created", "order_id", order.ID, "sku", order.SKU, "quantity", order.Quantity, "strategy", order.Strategy)
		}
		return order, nil
	case errors.Is(err, errReplayed):
		s.log.Debug("order replayed", "order_id", replayed.ID, "sku", replayed.SKU, "idempotency_key", req.IdempotencyKey)
		return s.asStored(ctx, replayed), nil
	}
	err = s.classify(ctx, err)
	if errors.Is(err, ErrSoldOut) && !errors.Is(err, errSoldOutByMark) {
		// Only the store's refusals mark: a mark's own refusal noted
		// again would stretch it past the observation it stands for.
		s.soldOut.note(req.SKU, req.Quantity, sent)
	}
	if req.IdempotencyKey != "" && (errors.Is(err, ErrSoldOut) || errors.Is(err, ErrBusy) || errors.Is(err, ErrLimitReached)) {
		if prior, ok := s.replayAfterRefusal(ctx, req.IdempotencyKey, fingerprint); ok {
			return prior, nil
		}
	}
	if errors.Is(err, ErrSoldOut) {
		return Order{}, s.soldOutError(req)
	}
	if !refusal(err) {
		s.log.Warn("order failed", "sku", req.SKU, "order_id", order.ID, "strategy", s.strategy.Name, "err", err)
	}
	return Order{}, err
}

// asStored is a replayed order as the database has it now, when the
// strategy answered the replay from its own store (the reservation
// strategies know only the first order's id): its state (paid, cancelled,
// expired) and its expiry, as GET /orders/{id} would answer it (found by
// review: a paid order's replay answered "held", without expires_at). An
// order not written yet, or a lookup that fails, leaves the answer as the
// strategy gave it.
func (s *Service) asStored(ctx context.Context, replayed Order) Order {
	if s.relay == nil {
		return replayed
	}
	// One lookup, no wait: a replay comes after its first answer, and an
	// order still on its way to the database is answered as taken.
	o, found, err := s.store.FindOrder(ctx, replayed.ID)
	if err != nil || !found || o.UserID != replayed.UserID {
		return replayed
	}
	if o, err = s.expireIfLapsed(ctx, o); err != nil {
		return replayed
	}
	return o
}

// refusal reports whether err is an answer about the order itself (sold
// out, past the limit, outside the window, an unknown SKU, a reused key),
// not a failure worth a warning.
func refusal(err error) bool {
	for _, r := range []error{ErrSoldOut, ErrLimitReached, ErrSaleNotStarted, ErrSaleEnded, ErrUnknownSKU, ErrIdempotencyConflict} {
		if errors.Is(err, r) {
			return true
		}
	}
	return false
}

// deduct takes the order through the strategy's Deduct, in the service's
// transaction (inTx); errReplayed with the prior order when the key was
// taken. A probe (markAdmits) is not refused by the mark it renews. A
// method of its own so that the closure and what it captures are
// allocated only on this path, not for a strategy that takes whole orders.
func (s *Service) deduct(ctx context.Context, req Request, order *Order, fingerprint []byte, probe bool) (Order, error) {
	var replayed Order
	inTx := func(ctx context.Context, deduct func(context.Context, Tx) error) error {
		if !probe && s.markAnswers(req) {
			// The same check as on the way in, at the last moment before
			// the transaction: an order that waited its turn (the row's
			// gate, the lock, a retry's pause) while another order of this
			// instance was refused sold out is refused without a round
			// trip too. Without it the orders queued when a sale sells
			// out (up to ROW_MAX_IN_FLIGHT's waiters, every lock waiter)
			// each take the row in turn only to find it empty, and the
			// sold-out answers are the slowest of the burst.
			return errSoldOutByMark
		}
		err := s.runTx(ctx, *order, func(ctx context.Context, tx Tx) error {
			if req.IdempotencyKey != "" {
				prior, err := s.lookupKey(ctx, tx, req.IdempotencyKey, fingerprint)
				if err != nil {
					return err
				}
				if prior != nil {
					replayed = *prior
					return errReplayed
				}
			}
			// The buyer's row before the stock row: a cancel or an expiry
			// takes them in that order too (order, buyer, stock), so the
			// two never wait for each other in opposite orders.
			if s.limit > 0 {
				ok, err := tx.ClaimUnits(ctx, req.SKU, req.UserID, req.Quantity, s.limit)
				if err != nil {
					return err
				}
				if !ok {
					return s.limitReached(req)
				}
			}
			if err := deduct(ctx, tx); err != nil {
				return err
			}
			expires, err := tx.InsertOrder(ctx, *order)
			if err != nil {
				return err
			}
			order.ExpiresAt = expires
			if req.IdempotencyKey == "" {
				return nil
			}
			inserted, err := tx.InsertIdempotency(ctx, IdempotencyRecord{
				Key: req.IdempotencyKey, SKU: req.SKU, RequestHash: fingerprint, OrderID: order.ID,
			})
			if err != nil {
				return err
			}
			if !inserted {
				return errKeyTaken
			}
			return nil
		})
		switch {
		case errors.Is(err, errVersionMoved):
			s.obs.Retried(s.strategy.Name, "version_moved")
		case errors.Is(err, ErrFencedOff):
			s.obs.FencedOff(s.strategy.Name)
		}
		return err
	}

	// Not in one return statement: inTx sets replayed, and Go does not
	// order reading a variable against a call in the same expression list.
	err := s.strategy.Deduct(ctx, req.SKU, req.Quantity, inTx)
	return replayed, err
}

// markAnswers reports whether the sold-out mark refuses req without asking
// the store. Never an order with a key: a retry of an order that was taken
// must get its order back, and only the strategy knows where the key is
// (the reservation strategies' reach the database later). Never under a
// per-buyer limit: the store answers a buyer at the limit limit_reached
// before it looks at the stock, and the mark, which does not know the
// buyer's units, would answer sold_out instead, an answer that invites a
// retry once units come back (found by review:
// TestSoldOutMarkAnswersABuyerAtTheLimitAsTheStoreWould).
func (s *Service) markAnswers(req Request) bool {
	return req.IdempotencyKey == "" && s.limit == 0 && s.soldOut.refuses(req.SKU, req.Quantity)
}

// markAdmits is markAnswers at an order's way in, where in the mark's
// second half one order at a time is let through as the probe that renews
// it (soldOutMarks.admit).
func (s *Service) markAdmits(req Request) (refuse bool, probe uint64) {
	if req.IdempotencyKey != "" || s.limit > 0 {
		return false, 0
	}
	return s.soldOut.admit(req.SKU, req.Quantity)
}

// markFor is the mark a taker may ask again while req waits its turn
// (PendingOrder.Mark): nil where markAnswers would not answer, and for the
// probe, which the mark it renews must not refuse.
func (s *Service) markFor(req Request, probe bool) SoldOutMark {
	if probe || req.IdempotencyKey != "" || s.limit > 0 || s.soldOut == nil {
		return nil
	}
	return s.soldOut
}

// errSoldOutByMark is a refusal by the sold-out mark, not by the store.
var errSoldOutByMark = fmt.Errorf("%w (refused by this instance's sold-out mark)", ErrSoldOut)

// soldOutError is the refusal of an order the stock does not cover.
func (s *Service) soldOutError(req Request) error {
	return fmt.Errorf("%w: fewer than %d units of %q are available", ErrSoldOut, req.Quantity, req.SKU)
}

// limitReached is the refusal of an order past the per-user limit.
func (s *Service) limitReached(req Request) error {
	return fmt.Errorf("%w: %q may hold or have paid for at most %d units of %q in this sale", ErrLimitReached, req.UserID, s.limit, req.SKU)
}

// lookupKey returns the order a key created before, nil if it has none, or
// ErrIdempotencyConflict when the key was used for another request.
func (s *Service) lookupKey(ctx context.Context, tx Tx, key string, fingerprint []byte) (*Order, error) {
	rec, found, err := tx.FindIdempotency(ctx, key)
	if err != nil || !found {
		return nil, err
	}
	if !bytes.Equal(rec.RequestHash, fingerprint) {
		return nil, fmt.Errorf("%w: key %q", ErrIdempotencyConflict, key)
	}
	o, err := tx.GetOrder(ctx, rec.OrderID)
	if err != nil {
		return nil, err
	}
	return &o, nil
}

// replayAfterRefusal looks the key up again, in a transaction of its own,
// before a request with a key is refused. An earlier attempt of the same
// request may have committed after this one looked: its COMMIT was in flight
// when the client gave up and retried (the retry's write then waited on its
// row lock and found the stock gone), or it was a newer lock holder that
// fenced this one off. Refusing would tell the client "sold out" or "busy"
// for a request that succeeded; the exploration of every schedule of a
// request and its retry found both (internal/explore). Only refused requests
// with a key pay for the extra read. A lookup that fails keeps the refusal.
func (s *Service) replayAfterRefusal(ctx context.Context, key string, fingerprint []byte) (Order, bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	var prior *Order
	// The transaction only reads: what it read was committed, so a commit
	// whose answer is lost afterwards does not undo it.
	_ = s.store.InTx(ctx, func(ctx context.Context, tx Tx) error {
		found, err := s.lookupKey(ctx, tx, key, fingerprint)
		prior = found
		return err
	})
	if prior == nil {
		return Order{}, false
	}
	s.log.Debug("order replayed after a refusal", "order_id", prior.ID, "sku", prior.SKU, "idempotency_key", key)
	return *prior, true
}

// runTx runs fn in a transaction, and runs it again when the database
// aborted it to resolve a conflict or a concurrent request took the same
// idempotency key. It never runs it again after a commit whose answer was
// lost: it looks for the order instead.
func (s *Service) runTx(ctx context.Context, order Order, fn func(context.Context, Tx) error) error {
	var err error
	for attempt := 0; attempt < s.txAttempts; attempt++ {
		err = s.store.InTx(ctx, fn)
		switch {
		case errors.Is(err, ErrOutcomeUnknown):
			return s.resolveUnknownCommit(ctx, order, err)
		case errors.Is(err, ErrConflict), errors.Is(err, errKeyTaken):
			reason := "conflict"
			if errors.Is(err, errKeyTaken) {
				reason = "key_taken"
			}
			s.obs.Retried(s.strategy.Name, reason)
			if perr := pause(ctx, backoff.Exponential(attempt, time.Millisecond, 20*time.Millisecond)); perr != nil {
				return perr
			}
		default:
			return err
		}
	}
	return fmt.Errorf("%w: transaction aborted %d times: %w", ErrBusy, s.txAttempts, err)
}

// resolveUnknownCommit asks the database whether a commit whose answer was
// lost created the order, before the buyer is answered: the order's id was
// chosen before the transaction, so its row is the proof, and the lookup
// waits for the SKU's row (Tx.ResolveOrder), so its answer is final.
// Found: the order was taken (nil). Not found: it was not, and nothing
// was deducted (ErrUnavailable, not unknown). The lookup has a budget of
// its own (UnknownCommitBudget): an overloaded database that lost the
// answer often fails a lookup under the same load too (found by an
// overload run, where two buyers were told 503 for orders that existed).
func (s *Service) resolveUnknownCommit(ctx context.Context, order Order, commitErr error) error {
	found, err := s.resolve(ctx, commitErr, func(ctx context.Context) (found bool, err error) {
		// A transaction of its own: it only reads, and one whose commit
		// answer is lost is a lookup that failed (tried again).
		err = s.store.InTx(ctx, func(ctx context.Context, tx Tx) error {
			_, found, err = tx.ResolveOrder(ctx, order.SKU, order.ID)
			return err
		})
		return found, err
	})
	switch {
	case err != nil:
		return err
	case found:
		s.log.Warn("commit answer lost, but the order exists", "order_id", order.ID, "err", commitErr)
		return nil
	}
	return NotLanded("the order was not taken, nothing was deducted", commitErr)
}

// classify turns a deadline or cancellation that reached the caller
// unwrapped into ErrBusy, so the caller sees one of the package's errors.
func (s *Service) classify(ctx context.Context, err error) error {
	known := []error{ErrSoldOut, ErrLimitReached, ErrSaleNotStarted, ErrSaleEnded, ErrUnknownSKU, ErrInvalid, ErrIdempotencyConflict, ErrBusy, ErrUnavailable}
	for _, k := range known {
		if errors.Is(err, k) {
			return err
		}
	}
	if errors.Is(err, ErrConflict) || ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrBusy, err)
	}
	return err
}

// FindOrder returns the order id of buyer userID: ErrInvalid for a
// malformed id or user, ErrOrderNotFound when there is no such order or it
// is another buyer's. A held order whose hold has lapsed is expired on the
// spot (its units go back) and answered expired. An order of the reservation strategies is found once
// the stream has written it to the database (usually within milliseconds
// of its 201).
func (s *Service) FindOrder(ctx context.Context, id, userID string) (Order, error) {
	id, err := canonicalOrderID(id)
	if err != nil {
		return Order{}, err
	}
	if err := ValidateUserID(userID); err != nil {
		return Order{}, err
	}
	// Bounded like an order: a read that waits behind a row lock (the
	// lazy expiry's) gives up and answers busy.
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	o, found, err := s.store.FindOrder(ctx, id)
	if err == nil && !found && s.relay != nil {
		o, found, err = s.awaitWritten(ctx, id)
	}
	if err != nil {
		return Order{}, s.classify(ctx, err)
	}
	if !found || o.UserID != userID {
		return Order{}, fmt.Errorf("%w: %s", ErrOrderNotFound, id)
	}
	return s.expireIfLapsed(ctx, o)
}

// awaitWritten looks for order id again for up to a second (within ctx),
// when the strategy counts the stock outside the database: its orders are
// answered 201 before its stream writes them here, usually milliseconds
// later, and a buyer who pays at once must find the order. An unknown id
// costs that second, at a few lookups. Only lookups that answered make it
// unknown (404): a lookup that failed, or that the second cut short, is
// the database's failure, answered as such (503), not as an absent order.
func (s *Service) awaitWritten(ctx context.Context, id string) (Order, bool, error) {
	wait, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	for attempt := 0; ; attempt++ {
		if pause(wait, backoff.Exponential(attempt, 2*time.Millisecond, 100*time.Millisecond)) != nil {
			return Order{}, false, nil
		}
		o, found, err := s.store.FindOrder(wait, id)
		if err != nil || found {
			return o, found, err
		}
	}
}

// canonicalOrderID accepts an order id as the service writes it, a UUID in
// its 36-character form, and returns it in lower case, as the service
// writes it: PostgreSQL's uuid column matches either case, MariaDB's
// CHAR(36) of a binary collation only the one stored, and an id must find
// the same order on both. uuid.Parse alone also takes "urn:uuid:…" and
// braced spellings, which one engine would refuse as a malformed value (a
// 500) and another answer as unknown.
func canonicalOrderID(id string) (string, error) {
	u, err := uuid.Parse(id)
	if err != nil || len(id) != 36 || u.String() != strings.ToLower(id) {
		return "", fmt.Errorf("%w: order id %q is not a UUID (36 characters, as the order's answer gave it)", ErrInvalid, id)
	}
	return u.String(), nil
}

// Level returns a SKU's stock.
func (s *Service) Level(ctx context.Context, sku string) (Level, error) {
	if err := ValidateSKU(sku); err != nil {
		return Level{}, err
	}
	if level := s.strategy.Level; level != nil {
		return level(ctx, sku)
	}
	return s.store.Level(ctx, sku)
}

// Audit returns the SKU's bookkeeping.
func (s *Service) Audit(ctx context.Context, sku string) (Audit, error) {
	if err := ValidateSKU(sku); err != nil {
		return Audit{}, err
	}
	if audit := s.strategy.Audit; audit != nil {
		return audit(ctx, sku)
	}
	return s.store.Audit(ctx, sku)
}

// Ready reports whether the database and the strategy's own backends answer.
func (s *Service) Ready(ctx context.Context) error {
	if err := s.store.Ping(ctx); err != nil {
		return err
	}
	if ping := s.strategy.Ping; ping != nil {
		return ping(ctx)
	}
	return nil
}

// OrderPage is a page of a buyer's orders; Next, when not "", is the
// after of the next page.
type OrderPage struct {
	Orders []Order
	Next   string
}

// ListOrders lists the orders of buyer userID, of sku only when it is not
// "", oldest first, a page of at most limit (1..MaxListedOrders; 0 for
// the most) after order id after ("" for the first page). It is how a
// buyer without an idempotency key finds what an answer lost or a 503 left
// behind: an order the database has is listed, whatever its buyer was
// told. A held order whose hold has lapsed is expired on the spot, as
// FindOrder does. An order of the reservation strategies is listed once
// the stream has written it (usually within milliseconds of its 201).
func (s *Service) ListOrders(ctx context.Context, userID, sku, after string, limit int) (OrderPage, error) {
	if err := ValidateUserID(userID); err != nil {
		return OrderPage{}, err
	}
	if sku != "" {
		if err := ValidateSKU(sku); err != nil {
			return OrderPage{}, err
		}
	}
	if after != "" {
		var err error
		if after, err = canonicalOrderID(after); err != nil {
			return OrderPage{}, err
		}
	}
	if limit == 0 {
		limit = MaxListedOrders
	}
	if limit < 1 || limit > MaxListedOrders {
		return OrderPage{}, fmt.Errorf("%w: limit must be an integer from 1 to %d", ErrInvalid, MaxListedOrders)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	// One more than the page: whether there is a next one.
	orders, err := s.store.ListOrders(ctx, userID, sku, after, limit+1)
	if err != nil {
		return OrderPage{}, s.classify(ctx, err)
	}
	var page OrderPage
	if len(orders) > limit {
		orders = orders[:limit]
		page.Next = orders[limit-1].ID
	}
	for i, o := range orders {
		if orders[i], err = s.expireIfLapsed(ctx, o); err != nil {
			return OrderPage{}, err
		}
	}
	page.Orders = orders
	return page, nil
}
