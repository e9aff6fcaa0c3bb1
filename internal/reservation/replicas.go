package reservation

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
)

// Redis replicates asynchronously: a primary answers a write before any
// replica has it, so a replica that Sentinel promotes after the primary is
// lost may lack the last orders the primary took. Answered 201, they
// would be lost: the database never sees them.
//
// WithReplicas closes that gap. After an order's script (or EXEC), on the
// same connection, WAIT n timeout returns how many replicas acknowledged
// the connection's last write. A replica applies the primary's stream in
// order, so that covers every write before it: the order's own, or, for
// a retry that finds its order taken by an earlier call (perhaps on
// another connection), the write that took it, because the reserve script
// and the watch path write the answer they found again (the same value,
// but a write: it moves the connection's offset past the original).
//
// The invariant, in one sentence: an order is answered 201 only once n
// replicas hold its stream entry. If the retry did not write, its WAIT
// would count from a connection's last write that may predate the order,
// and a 201 could be lost with the primary. (Debian's Redis 7.0 moves a
// connection's offset after every command, reads too, so there the write
// changes nothing; Redis 7.2 and later move it only on a write.)

// WithReplicas makes an order's 201 wait until its replicas have it, for
// at most timeout (REDIS_MODE=sentinel; RESERVE_WAIT_REPLICAS,
// RESERVE_WAIT_TIMEOUT): every replica the primary counts online, and at
// least n. An order the primary took that they do not all confirm in time
// is answered inventory.ErrOutcomeUnknown (a 503 that may have happened:
// the order is on the primary and is written if it survives; a retry with
// its Idempotency-Key finds it). A timeout below a millisecond is taken as
// a second: WAIT's 0 would wait for ever. Default n 0: an order is
// answered once the primary has it, as on a Redis without replicas.
//
// Why every online replica, not n of them: Sentinel promotes the replica
// it last saw with the most data (its INFO may be seconds old), not one
// that confirmed the order, so with n below the replicas' count one
// failure (the primary's) could promote a replica without a 201's order
// (found by review; TestALaggingReplicaIsWaitedForEvenWithAnotherThatHasTheOrder).
// Waiting for every replica online leaves only those that are not (their
// link lost or still syncing): a second failure. A replica that stays
// connected but stops acknowledging stalls the orders until the primary
// drops it (repl-timeout), each answered 503 after the timeout.
func WithReplicas(n int, timeout time.Duration) Option {
	if timeout < time.Millisecond {
		timeout = time.Second
	}
	return func(s *Store) {
		s.replicas, s.replicaWait = int64(max(n, 0)), timeout
		s.online.Store(unknownCount()) // not known yet: asked before the first WAIT
	}
}

// notReplicated: the primary took the order, but not every replica asked
// for confirmed it before the timeout.
type notReplicated struct {
	acked, want int64
	wait        time.Duration
	err         error // WAIT's, INFO's or the probe's own error, if one failed
}

func (e *notReplicated) Error() string {
	if e.err != nil {
		return fmt.Sprintf("the order is on the Redis primary, and WAIT for its %d replicas failed: %v", e.want, e.err)
	}
	return fmt.Sprintf("the order is on the Redis primary, but %d of its %d replicas had it after %s", e.acked, e.want, e.wait)
}

func (e *notReplicated) Unwrap() error { return e.err }

// waitsForReplicas: an order taken waits for replicas.
func (s *Store) waitsForReplicas() bool { return s.replicas > 0 }

// replicaWait is a WAIT and, after it, the primary's INFO replication,
// queued in one pipeline after the writes they cover; from is the count
// the WAIT's size was taken from.
type replicaWait struct {
	wait *redis.IntCmd
	info *redis.StringCmd
	from *replicaCount
	// probe is the write a WAIT after reads follows (awaitReadsReplicated).
	// A WAIT counts up to its connection's last write: after a refused
	// probe (NOREPLICAS under min-replicas-to-write, OOM at maxmemory)
	// that is an earlier write, and the WAIT may confirm at once what it
	// was to cover (found by review), so a refused probe confirms nothing.
	probe *redis.StatusCmd
}

// replicaCount is how many replicas a primary's INFO listed online; -1
// when not known. The Store holds the latest (Store.online), and a count
// replaces the one its WAIT was sized from only: one read from a server
// that has been left since (a failover) cannot overwrite the reset that
// the connection to the new one made (found by review).
type replicaCount struct{ n int64 }

// unknownCount is a new unknown count each time: one shared value would
// let a count sized from an earlier unknown replace a later one.
func unknownCount() *replicaCount { return &replicaCount{n: -1} }

// countFrom replaces from, the count a WAIT was sized from, with what
// info (that WAIT's INFO, or its error) says.
func (s *Store) countFrom(from *replicaCount, info string, err error) {
	switch {
	case err == nil:
		s.online.CompareAndSwap(from, &replicaCount{n: onlineReplicas(info)})
	case lostConnection(err):
		s.online.CompareAndSwap(from, unknownCount())
	}
}

// waitReplicas queues WAIT in p, after the writes it must cover, for as
// many replicas as were online last time (at least n), then INFO to learn
// how many are online now; nil when no replica is asked for. A replica
// that comes online between two WAITs was not waited for: that batch is
// answered 503 (confirmed), the next waits for it too.
func (s *Store) waitReplicas(ctx context.Context, p redis.Pipeliner) *replicaWait {
	if s.replicas == 0 {
		return nil
	}
	from := s.online.Load()
	online := from.n
	if online < 0 {
		// The first WAIT of this process, or on this server: ask how
		// many replicas to wait for, or it would wait for n, find more
		// online, and answer 503.
		if info, err := s.rdb.Info(ctx, "replication").Result(); err == nil {
			online = onlineReplicas(info)
			if fresh := (&replicaCount{n: online}); s.online.CompareAndSwap(from, fresh) {
				from = fresh
			}
		}
	}
	// Pipeliner lacks Wait: WAIT numreplicas timeout(ms), by hand.
	w := &replicaWait{from: from, wait: redis.NewIntCmd(ctx, "wait", max(s.replicas, online), s.replicaWait.Milliseconds())}
	_ = p.Process(ctx, w.wait)
	w.info = p.Info(ctx, "replication")
	return w
}

// confirmed is nil when w (from waitReplicas) was confirmed by every
// replica online after it, and at least n, or was not sent; otherwise the
// reason the writes it covers may still be lost with the primary.
func (s *Store) confirmed(w *replicaWait) error {
	if w == nil {
		return nil
	}
	acked, err := w.wait.Result()
	info, ierr := w.info.Result()
	s.countFrom(w.from, info, ierr)
	if err == nil {
		err = ierr
	}
	if w.probe != nil && err == nil {
		err = w.probe.Err()
	}
	want := s.replicas
	if ierr == nil {
		want = max(want, onlineReplicas(info))
	}
	if err == nil && acked >= want {
		return nil
	}
	return &notReplicated{acked: acked, want: want, wait: s.replicaWait, err: err}
}

// replicated is confirmed for an order taken ("ok", "replay" in reply, the
// script's, err nil); any other reply, or a script that failed (err, which
// it returns), waits for nothing, but its INFO still counts the replicas
// for the next WAIT.
func (s *Store) replicated(w *replicaWait, reply []string, err error) error {
	if err != nil || len(reply) == 0 || reply[0] != "ok" && reply[0] != "replay" {
		if w != nil {
			info, ierr := w.info.Result()
			s.countFrom(w.from, info, ierr)
		}
		return err
	}
	return s.confirmed(w)
}

// lostConnection: err is neither the server's answer nor the caller's
// deadline or cancel (nor a pool that had no connection free in time): the
// server, or the way to it, is gone.
func lostConnection(err error) bool {
	var (
		serverErr redis.Error
		netErr    net.Error
	)
	switch {
	case err == nil, errors.As(err, &serverErr),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, redis.ErrPoolTimeout), errors.As(err, &netErr) && netErr.Timeout():
		return false
	}
	return true
}

// A count of the replicas online is the server's that gave it. After a
// failover the client connects to the promoted replica, which has replicas
// of its own: one fewer than the old primary, one of them perhaps still
// resynchronising. A WAIT for the old primary's count runs its timeout out
// however fast they are, and the first orders on the new primary (whose
// replies need no WAIT: NOSCRIPT, "unchecked") waited it out round after
// round: the sale sold again a second after the Sentinels announced the
// new primary, not at once (found by timing scenario 14). So a lost
// connection, a failed dial, and a connection to another server than the
// last leave the count unknown, asked again before the next WAIT. (An
// order's WAIT is queued before its pipeline has a connection: when
// nothing was sent while the primary was down, the first batch after the
// switch still waits for the old count, one timeout, once.)
//
// What is left is the server's: the replica that resynchronises in full
// from the promoted one acknowledges nothing until its first REPLCONF ACK,
// which Redis 7.0 sends once a second, so the first 201 after a failover
// comes up to a second after the switch (every WAIT until then, for the
// one replica online, times out).

// recountOnNewServer is the client hook that does so.
type recountOnNewServer struct {
	s    *Store
	last atomic.Pointer[string] // the server of the last connection made
}

func (h *recountOnNewServer) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			h.s.online.Store(unknownCount())
			return nil, err
		}
		// The failover client dials the address the Sentinels name,
		// whatever addr says: the connection knows.
		server := conn.RemoteAddr().String()
		if prev := h.last.Swap(&server); prev == nil || *prev != server {
			h.s.online.Store(unknownCount())
		}
		return conn, nil
	}
}

func (h *recountOnNewServer) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *recountOnNewServer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// onlineReplicas counts the replicas INFO replication lists as online
// ("slave0:ip=…,port=…,state=online,…"): those WAIT counts.
func onlineReplicas(info string) int64 {
	var n int64
	for line := range strings.SplitSeq(info, "\n") {
		if strings.HasPrefix(line, "slave") && strings.Contains(line, ",state=online,") {
			n++
		}
	}
	return n
}

// The consumer waits for the replicas too, before it writes what it read:
// an entry the primary took while its replicas lagged (its order answered
// 503, may have happened) is lost with the primary, and if a consumer had
// written it to the database first, the check of the sale on the promoted
// replica would find the database ahead of Redis and close the sale. So a
// round of reads ends with a write (the probe key; the reads of our own
// pending entries write nothing) and WAIT, and a round whose WAIT falls
// short writes nothing: its entries stay pending, read again next round.

// awaitReadsReplicated queues the probe write and WAIT after a round of
// reads in p; nil when no replica is asked for.
func (s *Store) awaitReadsReplicated(ctx context.Context, p redis.Pipeliner) *replicaWait {
	if !s.waitsForReplicas() {
		return nil
	}
	probe := p.Set(ctx, s.prefix+"reserve:replicated", "", 0)
	w := s.waitReplicas(ctx, p)
	if w != nil {
		w.probe = probe
	}
	return w
}

// readsReplicated reports whether w (from awaitReadsReplicated) was
// confirmed, or was not sent.
func (s *Store) readsReplicated(w *replicaWait) bool { return s.confirmed(w) == nil }

// A sale's start waits for the replicas too: answered and then lost with
// the primary, it would leave the promoted replica without the sale (or
// with the older one), and every order would be answered 503 until the
// sale was started again. Its scripts (Close, Load, their catalog forms)
// are answered before the WAIT can follow them, so the WAIT follows a
// probe write of its own: a replica applies the primary's stream in order,
// so the probe comes after them in it. Returns and restocks need not wait:
// the check of the sale on a promoted replica gives back every one the
// database has (returnAgain).
//
// The scripts, the probe and the WAIT go through one connection, held for
// the start (onOneConnection): a connection never changes server. Through
// the pool, a failover between the scripts and the probe sent the probe
// to the promoted replica, which may lack the start, and its replica
// confirmed a start the new primary never had: the sale was answered
// started, then refused every order (found by review;
// TestAStartWhoseProbeReachesAPromotedReplicaIsNotConfirmed). On the held
// connection the probe fails instead (the old primary is gone, or refuses
// writes as a replica): 503, may have happened, and the start's retry with
// its key loads the sale on the new primary.

// onOneConnection runs fn with the client a start's writes and their
// probe go through: one connection of the pool, held for fn, when there
// are replicas to wait for; the pool itself otherwise.
func (s *Store) onOneConnection(fn func(redis.Cmdable) error) error {
	if s.waitsForReplicas() {
		if pool, ok := s.rdb.(interface{ Conn() *redis.Conn }); ok {
			c := pool.Conn()
			defer func() { _ = c.Close() }() // back to the pool
			return fn(c)
		}
	}
	return fn(s.rdb)
}

// replicatedOn is nil once every write c was answered before the call is
// on the replicas WithReplicas asks for (at once without them);
// ErrUnavailable when they do not confirm in time.
func (s *Store) replicatedOn(ctx context.Context, c redis.Cmdable) error {
	if !s.waitsForReplicas() {
		return nil
	}
	p := c.Pipeline()
	w := s.awaitReadsReplicated(ctx, p)
	_, _ = p.Exec(ctx) // each command has its own error
	if err := s.confirmed(w); err != nil {
		return fmt.Errorf("%w: %w", inventory.ErrUnavailable, err)
	}
	return nil
}
