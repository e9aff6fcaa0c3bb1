package reservation

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
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

// WithReplicas makes an order's 201 wait until n replicas have it, for at
// most timeout (REDIS_MODE=sentinel; RESERVE_WAIT_REPLICAS,
// RESERVE_WAIT_TIMEOUT). An order the primary took that fewer replicas
// confirm in time is answered inventory.ErrOutcomeUnknown (a 503 that may
// have happened: the order is on the primary and is written if it
// survives; a retry with its Idempotency-Key finds it). A timeout below a
// millisecond is taken as a second: WAIT's 0 would wait for ever.
// Default n 0: an order is answered once the primary has it, as on a
// Redis without replicas.
func WithReplicas(n int, timeout time.Duration) Option {
	if timeout < time.Millisecond {
		timeout = time.Second
	}
	return func(s *Store) { s.replicas, s.replicaWait = int64(max(n, 0)), timeout }
}

// notReplicated: the primary took the order, but fewer replicas than
// asked confirmed it before the timeout.
type notReplicated struct {
	acked, want int64
	wait        time.Duration
	err         error // WAIT's own error, if it failed
}

func (e *notReplicated) Error() string {
	if e.err != nil {
		return fmt.Sprintf("the order is on the Redis primary, and WAIT for %d replicas failed: %v", e.want, e.err)
	}
	return fmt.Sprintf("the order is on the Redis primary, but %d of the %d replicas asked for had it after %s", e.acked, e.want, e.wait)
}

func (e *notReplicated) Unwrap() error { return e.err }

// waitsForReplicas: an order taken waits for replicas.
func (s *Store) waitsForReplicas() bool { return s.replicas > 0 }

// waitReplicas queues WAIT in p, after the writes it must cover; nil when
// no replica is asked for.
func (s *Store) waitReplicas(ctx context.Context, p redis.Pipeliner) *redis.IntCmd {
	if s.replicas == 0 {
		return nil
	}
	// Pipeliner lacks Wait: WAIT numreplicas timeout(ms), by hand.
	cmd := redis.NewIntCmd(ctx, "wait", s.replicas, s.replicaWait.Milliseconds())
	_ = p.Process(ctx, cmd)
	return cmd
}

// replicated is nil when wait (from waitReplicas) confirmed enough
// replicas, or was not sent, and otherwise the order's reason to answer
// that it may have happened. reply is the script's: only an order taken
// ("ok", "replay") waits for its replicas.
func (s *Store) replicated(wait *redis.IntCmd, reply []string) error {
	if wait == nil || len(reply) == 0 || reply[0] != "ok" && reply[0] != "replay" {
		return nil
	}
	n, err := wait.Result()
	if err == nil && n >= s.replicas {
		return nil
	}
	return &notReplicated{acked: n, want: s.replicas, wait: s.replicaWait, err: err}
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
func (s *Store) awaitReadsReplicated(ctx context.Context, p redis.Pipeliner) *redis.IntCmd {
	if !s.waitsForReplicas() {
		return nil
	}
	p.Set(ctx, s.prefix+"reserve:replicated", "", 0)
	return s.waitReplicas(ctx, p)
}

// readsReplicated reports whether wait (from awaitReadsReplicated)
// confirmed the replicas asked for, or was not sent.
func (s *Store) readsReplicated(wait *redis.IntCmd) bool {
	if wait == nil {
		return true
	}
	n, err := wait.Result()
	return err == nil && n >= s.replicas
}
