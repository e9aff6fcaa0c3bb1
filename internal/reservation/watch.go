package reservation

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/keygate"
)

// The optimistic variant (redis-watch): the textbook WATCH, read, check, then
// MULTI/EXEC. It keeps every key, answer and stream entry of the script, so
// the consumer, the audit and instances running the script can share a sale
// with it. The invariant: EXEC applies the decrement only if no watched key
// (the sale, the keys, the buyers' counts) changed since the read that decided it, so each
// decrement was checked against the stock it leaves. Without the WATCH, two
// orders would both read the last unit and both decrement it.

// errRecheck: the server's replication id is not the one the sale was
// checked under: it restarted, or was promoted or resynchronised, since
// (see Store.runReserve and Store.recheck).
var errRecheck = errors.New("redis replication id changed: the sale is not checked yet")

// errChecking: a check of the sale is under way (see Store.recheck).
var errChecking = errors.New("the sale is being checked")

// WithOptimisticTransactions makes Reserve take orders with WATCH, a read,
// a check in Go, then MULTI/EXEC (redis-watch), instead of the script. An
// EXEC that finds a watched key changed takes nothing and the attempt runs
// again after a random backoff up to base·2^attempt (capped at 25ms), at
// most attempts times (then 503 busy); each process lets at most inFlight
// attempts on one SKU run at once (0: no bound), because all but one of the
// attempts that run together on a SKU lose. Default: the script.
func WithOptimisticTransactions(attempts, inFlight int) Option {
	return func(s *Store) {
		s.optimistic, s.watchAttempts = true, max(1, attempts)
		s.gate = nil
		if inFlight > 0 {
			s.gate = keygate.New(inFlight)
		}
	}
}

// reserveWatching answers as the reserve script does; {"busy"} when every
// attempt lost its race, or the order's deadline came while it waited.
func (s *Store) reserveWatching(ctx context.Context, r Reservation) ([]string, error) {
	checked := false
	var waitedSince time.Time
	for attempt := 0; attempt < s.watchAttempts; attempt++ {
		reply, err := s.watchOnce(ctx, r)
		if errors.Is(err, errChecking) {
			// Wait for the check under way; one that has lasted 2 s is
			// taken for dead and checked again, as the script does.
			if waitedSince.IsZero() {
				waitedSince = time.Now()
			}
			if time.Since(waitedSince) > 2*time.Second {
				err = errRecheck
			} else {
				if backoff.Wait(ctx, backoff.Exponential(attempt, time.Millisecond, 25*time.Millisecond)) != nil {
					return nil, errUnchecked{fmt.Errorf("sale %q still being checked at the order's deadline", r.Order.SKU)}
				}
				attempt-- // waiting for a check is not a lost race
				continue
			}
		}
		switch {
		case errors.Is(err, errRecheck) && !checked:
			if err := s.recheck(ctx, r.Order.SKU); err != nil {
				return nil, err
			}
			checked = true
			continue
		case errors.Is(err, errRecheck):
			return nil, errUnchecked{err}
		case !errors.Is(err, redis.TxFailedErr):
			return reply, err
		}
		if backoff.Wait(ctx, backoff.Exponential(attempt, time.Millisecond, 25*time.Millisecond)) != nil {
			return []string{"busy"}, nil
		}
	}
	return []string{"busy"}, nil
}

// markRefusal is an attempt refused by the instance's sold-out mark
// (Reservation.Mark) before it reached Redis.
type markRefusal struct{ err error }

func (m markRefusal) Error() string { return m.err.Error() }
func (m markRefusal) Unwrap() error { return m.err }

// watchOnce is one attempt, once the SKU's gate lets it in.
func (s *Store) watchOnce(ctx context.Context, r Reservation) ([]string, error) {
	if s.gate != nil {
		leave, err := s.gate.Enter(ctx, r.Order.SKU)
		if err != nil {
			return []string{"busy"}, nil
		}
		defer leave()
	}
	if r.Mark != nil {
		// Asked again after the gate and after a lost race's pause: an
		// order that waited there while this instance learned that the
		// SKU sold out is refused without a round trip. Without it the
		// orders queued in the gate when a sale sells out each take a
		// turn only to read it empty, and the sold-out answers are the
		// slowest of the burst.
		if err := r.Mark.Refusal(r.Order.SKU, r.Order.Quantity); err != nil {
			return nil, markRefusal{err}
		}
	}
	k := s.keys(r.Order.SKU)
	placed := s.placedKey(r.Order.SKU, r.Order.ID)
	fp := hex.EncodeToString(r.Fingerprint)
	var reply []string
	err := s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		var (
			sale  *redis.SliceCmd
			prior *redis.StringCmd
			done  *redis.StringCmd
			info  *redis.StringCmd
			had   *redis.StringCmd
			clock *redis.TimeCmd
			open  *redis.IntCmd
		)
		_, _ = tx.Pipelined(ctx, func(p redis.Pipeliner) error {
			sale = p.HMGet(ctx, k.sale, "epoch", "available", "base", "replid", "starts", "ends")
			clock = p.Time(ctx)
			open = p.Exists(ctx, k.open)
			if r.Key != "" {
				prior = p.HGet(ctx, k.idem, r.Key)
			}
			done = p.Get(ctx, placed)
			info = p.Info(ctx, "replication")
			if r.PerUserLimit > 0 {
				had = p.HGet(ctx, k.buyers, r.Order.UserID)
			}
			return nil
		})
		cmds := []redis.Cmder{sale, done, info, clock, open}
		if prior != nil {
			cmds = append(cmds, prior)
		}
		if had != nil {
			cmds = append(cmds, had)
		}
		for _, c := range cmds {
			if c.Err() != nil && !errors.Is(c.Err(), redis.Nil) {
				return c.Err()
			}
		}
		vals := sale.Val()
		epoch, _ := vals[0].(string)
		if epoch == "" {
			reply = []string{"unloaded"}
			return nil
		}
		base, _ := vals[2].(string)
		checkedUnder, _ := vals[3].(string)
		if strings.HasPrefix(checkedUnder, "checking:") {
			return errChecking
		}
		// The replication id is read here, before MULTI, not inside
		// EXEC (a transaction cannot branch on it): if the server's data
		// is replaced by another history between this read and EXEC (it
		// turns replica and resynchronises, then is promoted again), the
		// full resynchronisation flushes the data set, which touches
		// every watched key, and EXEC applies nothing; while it is a
		// replica EXEC is refused (READONLY). Checked on Redis 7.0 here:
		// WATCH, REPLICAOF another master, full sync, REPLICAOF NO ONE,
		// then EXEC on the first connection answers nil. A restart ends
		// the connection, and the WATCH with it.
		// A replica carries its master's id while its data lags: only
		// a master's id counts (see luaReplID). A master at this read
		// can change its id before EXEC only by a restart, which ends
		// the WATCH, or a resynchronisation, which touches the watched
		// keys (found by review: a replica promoted between the read
		// and EXEC sold from its lagging copy).
		if !isMaster(info.Val()) || checkedUnder != replID(info.Val()) {
			return errRecheck
		}
		if placedBase, at, _ := strings.Cut(done.Val(), " "); done.Val() != "" && placedBase == base {
			// Taken by an earlier attempt of this very order, whose
			// answer was lost: "<base> <its time>", as below.
			reply = []string{"ok", r.Order.ID, at}
			return s.awaitReplicasOf(ctx, tx, reply, func(p redis.Pipeliner) []redis.Cmder {
				return []redis.Cmder{p.Set(ctx, placed, done.Val(), redis.KeepTTL)}
			})
		}
		if prior != nil && prior.Err() == nil {
			fpOf, id, _ := cut(prior.Val())
			if fpOf != fp {
				reply = []string{"conflict"}
				return nil
			}
			reply = []string{"replay", id}
			return s.awaitReplicasOf(ctx, tx, reply, func(p redis.Pipeliner) []redis.Cmder {
				return []redis.Cmder{p.HSet(ctx, k.idem, r.Key, prior.Val())}
			})
		}
		// The window, on Redis's clock as the script reads it. The end
		// also needs the open key, watched: it expires at the end, so an
		// EXEC sent inside the window that lands after the end applies
		// nothing (Redis fails EXEC when a watched key expired since
		// WATCH), and the retry reads "ended" (found by review: a late
		// EXEC sold after the end). Its expiry is in whole milliseconds,
		// rounded down: redis-watch closes up to a millisecond early,
		// never late.
		if refusal := outsideWindow(clock.Val(), vals[4], vals[5]); refusal != "" {
			reply = []string{refusal}
			return nil
		}
		if ends, _ := vals[5].(string); ends != "" && open.Val() == 0 {
			reply = []string{"ended"}
			return nil
		}
		if had != nil {
			// The buyer's count is watched with the sale: a second
			// order of the buyer that commits first makes this EXEC
			// apply nothing, and the retry reads its count.
			units, err := parseCount(had)
			if err != nil {
				return err
			}
			if units+r.Order.Quantity > r.PerUserLimit {
				reply = []string{"limit"}
				return nil
			}
		}
		availableText, _ := vals[1].(string)
		available, err := strconv.ParseInt(availableText, 10, 64)
		if err != nil {
			return fmt.Errorf("the sale's available is %q: %w", availableText, err)
		}
		if available < r.Order.Quantity {
			reply = []string{"soldout"}
			return nil
		}
		// The order's time is Redis's clock as read above, before EXEC:
		// its answer promises its hold until that time plus the hold,
		// and so does a retry's that finds it placed (the placed key
		// keeps it; XADD's own id is known only after EXEC). The entry
		// carries it ("at"), and the consumer never writes an earlier
		// expiry.
		at := strconv.FormatInt(clock.Val().UnixMilli(), 10) + "-0"
		values := []any{"id", r.Order.ID, "q", r.Order.Quantity, "u", r.Order.UserID, "k", r.Key, "h", fp, "e", epoch, "s", r.Order.Strategy,
			"hd", r.Order.Hold.Milliseconds(), "at", at}
		if had != nil {
			// Claimed on the buyer's count: its return gives this back.
			values = append(values, "c", r.Order.Quantity)
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.HIncrBy(ctx, k.sale, "available", -r.Order.Quantity)
			p.HIncrBy(ctx, k.sale, "ordered", r.Order.Quantity)
			p.HIncrBy(ctx, k.sale, "orders", 1)
			if had != nil {
				p.HIncrBy(ctx, k.buyers, r.Order.UserID, r.Order.Quantity)
			}
			p.XAdd(ctx, &redis.XAddArgs{Stream: k.orders, Values: values})
			if r.Key != "" {
				p.HSet(ctx, k.idem, r.Key, fp+" "+r.Order.ID)
			}
			p.Set(ctx, placed, base+" "+at, s.answerTTL)
			return nil
		})
		if err != nil {
			return err
		}
		reply = []string{"ok", r.Order.ID, at}
		return s.awaitReplicasOf(ctx, tx, reply, nil)
	}, k.sale, k.idem, k.buyers, k.open)
	return reply, err
}

// awaitReplicasOf waits on tx's connection for the replicas of the order
// in reply (replicas.go), after rewrite's writes: a retry that found its
// order taken writes what it found again, so that WAIT covers the write
// that took it. Nothing is sent when no replica is asked for.
func (s *Store) awaitReplicasOf(ctx context.Context, tx *redis.Tx, reply []string, rewrite func(redis.Pipeliner) []redis.Cmder) error {
	if !s.waitsForReplicas() {
		return nil
	}
	var (
		rewritten []redis.Cmder
		wait      *replicaWait
	)
	_, _ = tx.Pipelined(ctx, func(p redis.Pipeliner) error {
		if rewrite != nil {
			rewritten = rewrite(p)
		}
		wait = s.waitReplicas(ctx, p)
		return nil
	})
	for _, c := range rewritten {
		if c.Err() != nil {
			// The rewrite failed, so WAIT does not cover the order.
			return &notReplicated{want: s.replicas, wait: s.replicaWait, err: c.Err()}
		}
	}
	return s.replicated(wait, reply, nil)
}

// outsideWindow is "not_started" or "ended" when now is outside the
// window whose bounds (Unix µs, "" or absent: open) the sale hash holds,
// "" inside it.
func outsideWindow(now time.Time, starts, ends any) string {
	us := now.UnixMicro()
	bound := func(v any) (int64, bool) {
		text, _ := v.(string)
		n, err := strconv.ParseInt(text, 10, 64)
		return n, err == nil
	}
	if s, ok := bound(starts); ok && us < s {
		return "not_started"
	}
	if e, ok := bound(ends); ok && us >= e {
		return "ended"
	}
	return ""
}

// parseCount reads a buyer's units from HGET's reply (none: 0).
func parseCount(c *redis.StringCmd) (int64, error) {
	if errors.Is(c.Err(), redis.Nil) {
		return 0, nil
	}
	n, err := strconv.ParseInt(c.Val(), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("a buyer's units are %q: %w", c.Val(), err)
	}
	return n, nil
}

// replID reads master_replid from the text of INFO replication.
func replID(info string) string { return infoField(info, "master_replid") }

// isMaster reads role:master from the text of INFO replication.
func isMaster(info string) bool { return infoField(info, "role") == "master" }

// infoField reads one field of an INFO reply ("name:value" lines).
func infoField(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimRight(v, "\r\n")
		}
	}
	return ""
}

// cut splits "fingerprint orderID".
func cut(v string) (fp, id string, ok bool) {
	for i := 0; i < len(v); i++ {
		if v[i] == ' ' {
			return v[:i], v[i+1:], true
		}
	}
	return v, "", false
}
