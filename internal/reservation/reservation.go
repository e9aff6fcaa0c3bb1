// Package reservation is the redis-reserve and redis-watch strategies: it
// counts each SKU's stock in Redis and takes an order with one atomic script
// (or WATCH/MULTI/EXEC) that checks the sale, the idempotency key and the
// stock, decrements it and appends the order to the SKU's stream; a
// Consumer in every instance then writes the streamed orders to the
// database and removes them. Reserved is the strategy the Service runs; it
// declares what it needs of the store (Reservations), which Store
// implements over Redis, and of the database (EpochSales).
//
// Durability: an answer is sent only after Redis replied, and a Redis with
// appendonly yes and appendfsync always writes and fsyncs its AOF before it
// replies (CheckDurable refuses any other). What survives what is written
// in docs/design/reservation-durability.md.
package reservation

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/keygate"
)

// Group is the consumer group of every SKU's stream.
const Group = "persist"

// Ledger is what a Store needs from the database to check a Redis whose
// data may have changed under it (a restart, a failover): one transaction
// with the SKU's stock row locked, to write the orders still in its stream,
// compare, and renumber the sale (SaleRecheck).
type Ledger interface {
	RecheckSale(ctx context.Context, sku string, check func(ctx context.Context, r SaleRecheck) error) error
}

// A sale's number (sale_epoch) is the sale's own number times saleStride
// plus how often it was renumbered: StartSale moves to the next multiple,
// a check of a restarted Redis adds one. Two numbers belong to one sale
// when they agree above the stride.
const saleStride = 1 << 20

func sameSale(a, b int64) bool { return a/saleStride == b/saleStride }

// Store is Reservations on one Redis server or one Redis Cluster.
type Store struct {
	rdb       redis.UniversalClient
	ledger    Ledger
	log       *slog.Logger
	prefix    string
	answerTTL time.Duration
	retryWait time.Duration
	// pipelineCount is WithPipelines' n.
	pipelineCount int
	// wake nudges this process's Consumer: an order was just logged.
	wake chan struct{}
	// touched holds the SKUs this process logged orders of since its
	// consumer last looked, so the consumer reads their streams at once.
	// The consumer empties it; without one it stops growing at
	// maxTouched (the consumer's sweep finds such streams anyway).
	touchedMu sync.Mutex
	touched   map[string]struct{}
	// checks runs one check of a SKU's sale at a time in this process;
	// orders of the SKU that arrive meanwhile wait for its result.
	checks singleflight.Group
	// checkLimit bounds one check, whatever the deadline of the order that
	// began it, so that a check outliving its buyer still ends and the
	// next buyer finds the sale open.
	checkLimit time.Duration
	// The optimistic variant (watch.go): attempts per order, and a gate
	// per SKU bounding the attempts in flight (nil: no bound).
	optimistic    bool
	watchAttempts int
	gate          *keygate.Gate
	// pipelines sends the scripts of orders that arrive together in one
	// pipeline (coalesce.go); nil sends each on its own.
	pipelines *coalescer
	// replicas and replicaWait are WithReplicas' (replicas.go); online
	// the replicas the primary last counted online.
	replicas    int64
	replicaWait time.Duration
	online      atomic.Pointer[replicaCount]
}

var _ Reservations = (*Store)(nil)

// Option configures New.
type Option func(*Store)

// WithPrefix sets the prefix of every key. Default "stock:". Instances
// that share a sale must share the prefix.
func WithPrefix(p string) Option { return func(s *Store) { s.prefix = p } }

// WithLogger sets the logger of the checks of a restarted Redis. Default
// slog.Default().
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.log = l } }

// WithAnswerTTL sets how long an order's answer is kept for a retry of the
// same call whose first answer was lost. It must outlast an order's
// deadline. Default 5 minutes.
func WithAnswerTTL(d time.Duration) Option { return func(s *Store) { s.answerTTL = d } }

// WithPipelines sets how many pipelines of one SKU's reserve scripts may be
// in flight at once; the orders that arrive while they are all out go
// together in the next one. 0 sends every order's script on its own, a
// round trip each. Default 4: under a burst the pipelines carry dozens of
// orders each, and a lone order is sent at once, as without them.
func WithPipelines(n int) Option { return func(s *Store) { s.pipelineCount = n } }

// New returns a Store over rdb that checks a restarted Redis against
// ledger (the database). rdb should not retry commands itself (MaxRetries
// -1): Reserve retries its own script, which is safe to repeat, and a
// retried Load would be refused or be a no-op.
func New(rdb redis.UniversalClient, ledger Ledger, opts ...Option) *Store {
	s := &Store{rdb: rdb, ledger: ledger, log: slog.Default(), prefix: "stock:", answerTTL: 5 * time.Minute,
		retryWait: 20 * time.Millisecond, wake: make(chan struct{}, 1), pipelineCount: 4,
		touched: map[string]struct{}{}, checkLimit: checkTakeover}
	for _, o := range opts {
		o(s)
	}
	if s.pipelineCount > 0 {
		s.pipelines = newCoalescer(rdb, s.pipelineCount, s)
	}
	if s.waitsForReplicas() {
		rdb.AddHook(&recountOnNewServer{s: s})
	}
	return s
}

// keys of one SKU (see scripts.go).
type skuKeys struct{ sale, epoch, idem, orders, buyers, returned, open, restocks string }

func (s *Store) keys(sku string) skuKeys {
	base := s.prefix + "{" + sku + "}:"
	return skuKeys{sale: base + "sale", epoch: base + "epoch", idem: base + "keys", orders: base + "orders", buyers: base + "buyers", returned: base + "returned", open: base + "open", restocks: base + "restocks"}
}

// reserveKeys are the reserve script's keys (KEYS[1..5]): sale, idem,
// orders, the order's placed key and buyers of keys and placedKey, built
// alone because they are built for every order.
func (s *Store) reserveKeys(sku, orderID string) []string {
	base := s.prefix + "{" + sku + "}:"
	return []string{base + "sale", base + "keys", base + "orders", base + "placed:" + orderID, base + "buyers"}
}

func (s *Store) placedKey(sku, orderID string) string {
	return s.prefix + "{" + sku + "}:placed:" + orderID
}

// catalogKey is the sorted set of the SKUs on sale, each scored with the
// number of its latest sale (Close writes it, ZADD GT). The consumers'
// sweep and the reconciler walk it; a sale sold out and drained leaves it
// (Consumer.sweep). It is not in any SKU's slot.
func (s *Store) catalogKey() string { return s.prefix + "reserve:catalog" }

// Reserve implements Reservations. A call whose answer is lost
// (a broken connection, a timeout) is run again until the order's deadline:
// the script keeps the answer of the order id it took, so a second run
// returns it instead of taking the stock twice. When no answer comes before
// the deadline the outcome is unknown (inventory.ErrOutcomeUnknown, a 503):
// the order may have been taken, and a retry with its Idempotency-Key
// finds it.
func (s *Store) Reserve(ctx context.Context, r Reservation) (Taken, error) {
	keys := s.reserveKeys(r.Order.SKU, r.Order.ID)
	args := []any{r.Order.ID, r.Order.Quantity, r.Order.UserID, r.Key, hex.EncodeToString(r.Fingerprint), s.answerTTL.Milliseconds(), r.Order.Strategy, r.PerUserLimit, r.Order.Hold.Milliseconds()}
	// mayHaveRun: an earlier attempt may have reached Redis and taken the
	// order. A retry's answer is then only about the retry: "ok" finds the
	// first run's order, but any refusal (the sale closed meanwhile, a
	// server error) leaves the first run's outcome unknown.
	mayHaveRun := false
	for {
		var reply []string
		var err error
		if s.optimistic {
			reply, err = s.reserveWatching(ctx, r)
		} else {
			reply, err = s.runReserve(ctx, r.Order.SKU, keys, args)
		}
		if err == nil {
			taken, aerr := s.answer(r, reply)
			if aerr != nil && mayHaveRun {
				return Taken{}, fmt.Errorf("%w: an earlier attempt's answer was lost, and the retry was refused: %w", inventory.ErrOutcomeUnknown, aerr)
			}
			return taken, aerr
		}
		var short *notReplicated
		if errors.As(err, &short) {
			// Taken on the primary, not confirmed by its replicas: it is
			// written if the primary survives, lost if it does not.
			s.logged(r.Order.SKU)
			return Taken{}, fmt.Errorf("%w: %w", inventory.ErrOutcomeUnknown, err)
		}
		var marked markRefusal
		if errors.As(err, &marked) {
			// Refused by the instance's sold-out mark, nothing sent, and
			// no earlier attempt may have run (the mark is not asked
			// then, below).
			return Taken{}, marked.err
		}
		if _, cluster := s.rdb.(*redis.ClusterClient); cluster {
			// go-redis' cluster client sends a command again by itself
			// after a broken connection (to the same node, then another),
			// so whatever error comes back, an earlier send may have run
			// (found by TestClusterSellsOnEveryMasterThroughARestart: a
			// refused connection answered 503 for an order that existed).
			mayHaveRun = true
		}
		var (
			serverErr redis.Error
			unchecked errUnchecked
		)
		refused := errors.As(err, &serverErr) && !retriableServerError(err) || isRefused(err) ||
			errors.As(err, &unchecked) || errors.Is(err, errNotSent)
		switch {
		case refused && mayHaveRun:
			return Taken{}, fmt.Errorf("%w: an earlier attempt's answer was lost, and Redis refused the retry: %w", inventory.ErrOutcomeUnknown, err)
		case refused:
			// The server refused the script (out of memory, a read-only
			// replica) or the connection, or a restarted server could not
			// be checked: the script took nothing.
			return Taken{}, fmt.Errorf("%w: reserve in Redis: %w", inventory.ErrUnavailable, err)
		}
		mayHaveRun = true
		// An earlier attempt may have taken the order: the retry asks
		// Redis, where it finds its order, never the sold-out mark, which
		// would answer sold out for an order taken (found by review:
		// TestWatchRetryAfterALostExecAnswerIsNotSoldOut: the order that
		// takes the last unit is the one whose answer the next order's
		// mark follows).
		r.Mark = nil
		t := time.NewTimer(s.retryWait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return Taken{}, fmt.Errorf("%w: no answer from Redis before the order's deadline: %w", inventory.ErrOutcomeUnknown, errors.Join(err, context.Cause(ctx)))
		}
	}
}

// runReserve runs the reserve script by its hash only. The script answers
// "unchecked" when the server's replication id is not the one the sale was
// last checked under: Redis gives a master a new id whenever it starts (a
// restart, with or without its AOF) and when it is promoted or
// resynchronised, so its data may be another history than the one the
// sale's orders were answered from. That SKU alone is checked against the
// database (recheck), then the order runs again; until then no order of
// it is taken. Redis also forgets its scripts when it restarts: NOSCRIPT
// only loads the script again, and the script then finds the new id for
// every sale on first use, one SKU at a time, so the cost of a restart is
// paid by the SKUs being ordered, never by the whole catalog at once.
func (s *Store) runReserve(ctx context.Context, sku string, keys []string, args []any) ([]string, error) {
	checked, loaded := false, false
	for wait := time.Millisecond; ; wait = min(2*wait, 20*time.Millisecond) {
		reply, err := s.evalReserve(ctx, sku, keys, args)
		switch {
		case isNoScript(err) && !loaded:
			if err := reserveScript.Load(ctx, s.rdb).Err(); err != nil {
				return nil, errUnchecked{fmt.Errorf("load the reserve script: %w", err)}
			}
			loaded = true
		case err == nil && len(reply) == 1 && reply[0] == "unchecked" && !checked:
			if err := s.recheck(ctx, sku); err != nil {
				return nil, err
			}
			checked = true
		case err == nil && len(reply) == 1 && reply[0] == "checking":
			// Another check of the sale is under way (here or in another
			// instance): wait for it, within the order's deadline.
			if backoff.Wait(ctx, wait) != nil {
				return nil, errUnchecked{fmt.Errorf("sale %q still being checked at the order's deadline", sku)}
			}
		case err == nil && len(reply) == 1 && reply[0] == "unchecked":
			return nil, errUnchecked{fmt.Errorf("sale %q still unchecked after its check", sku)}
		case isNoScript(err):
			return nil, errUnchecked{fmt.Errorf("the reserve script is missing again after it was loaded: %w", err)}
		default:
			return reply, err
		}
	}
}

// evalReserve runs the reserve script by its hash, in a pipeline with other
// orders of the SKU when WithPipelines allows it.
func (s *Store) evalReserve(ctx context.Context, sku string, keys []string, args []any) ([]string, error) {
	switch {
	case s.pipelines != nil:
		return s.pipelines.run(ctx, sku, keys, args)
	case s.replicas == 0:
		return reserveScript.EvalSha(ctx, s.rdb, keys, args...).StringSlice()
	}
	// WAIT on the script's connection: the same pipeline.
	pipe := s.rdb.Pipeline()
	cmd := reserveScript.EvalSha(ctx, pipe, keys, args...)
	wait := s.waitReplicas(ctx, pipe)
	_, _ = pipe.Exec(ctx) // each command has its own error
	reply, err := cmd.StringSlice()
	return reply, s.replicated(wait, reply, err)
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// answer turns the script's reply into the order taken or the domain's
// error. A taken order's reply carries its stream entry's id, Redis's
// time of the order in milliseconds ("" from an older script's run).
func (s *Store) answer(r Reservation, reply []string) (Taken, error) {
	switch {
	case len(reply) >= 2 && reply[0] == "ok":
		s.logged(r.Order.SKU)
		taken := Taken{OrderID: reply[1]}
		if len(reply) == 3 {
			taken.At = entryTime(reply[2])
		}
		return taken, nil
	case len(reply) == 2 && reply[0] == "replay":
		return Taken{OrderID: reply[1]}, nil
	}
	return Taken{}, s.refusal(r, reply)
}

// entryTime is the time in a stream entry's id ("<ms>-<seq>"), zero when
// it has none.
func entryTime(id string) time.Time {
	ms, err := strconv.ParseInt(strings.SplitN(id, "-", 2)[0], 10, 64)
	if err != nil || id == "" {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// refusal is the domain's error for a reply that takes no order.
func (s *Store) refusal(r Reservation, reply []string) error {
	switch {
	case len(reply) == 1 && reply[0] == "conflict":
		return fmt.Errorf("%w: key %q", inventory.ErrIdempotencyConflict, r.Key)
	case len(reply) == 1 && reply[0] == "soldout":
		return inventory.ErrSoldOut
	case len(reply) == 1 && reply[0] == "not_started":
		return fmt.Errorf("%w: %q", inventory.ErrSaleNotStarted, r.Order.SKU)
	case len(reply) == 1 && reply[0] == "ended":
		return fmt.Errorf("%w: %q", inventory.ErrSaleEnded, r.Order.SKU)
	case len(reply) == 1 && reply[0] == "limit":
		return fmt.Errorf("%w: buyer %q may take %d units of %q in this sale", inventory.ErrLimitReached, r.Order.UserID, r.PerUserLimit, r.Order.SKU)
	case len(reply) == 1 && reply[0] == "busy":
		return fmt.Errorf("%w: every optimistic attempt on %q lost its race", inventory.ErrBusy, r.Order.SKU)
	case len(reply) == 1 && reply[0] == "unloaded":
		return fmt.Errorf("%w: %q", ErrSaleNotLoaded, r.Order.SKU)
	}
	return fmt.Errorf("%w: unexpected reply from the reserve script: %q", inventory.ErrUnavailable, reply)
}

// retriableServerError: the server answered with an error after which the
// script may or may not have run (a cluster redirection the client did not
// follow, a server busy with another script, a loading server).
func retriableServerError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "LOADING", "BUSY"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

func isRefused(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// maxTouched bounds Store.touched when no consumer empties it.
const maxTouched = 1 << 16

// logged tells this process's consumer that an order of sku is in its
// stream.
func (s *Store) logged(sku string) {
	s.touch(sku)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// touch notes that this process logged an order of sku, for its consumer.
func (s *Store) touch(sku string) {
	s.touchedMu.Lock()
	defer s.touchedMu.Unlock()
	if len(s.touched) < maxTouched {
		s.touched[sku] = struct{}{}
	}
}

// takeTouched returns the SKUs touched since the last call, and forgets
// them.
func (s *Store) takeTouched() []string {
	s.touchedMu.Lock()
	defer s.touchedMu.Unlock()
	if len(s.touched) == 0 {
		return nil
	}
	skus := make([]string, 0, len(s.touched))
	for sku := range s.touched {
		skus = append(skus, sku)
	}
	clear(s.touched)
	return skus
}

// Ping implements Reservations.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("%w: Redis: %w", inventory.ErrUnavailable, err)
	}
	return nil
}
