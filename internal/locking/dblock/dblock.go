// Package dblock is the textbook database lock table, with the fixes their
// own analysis calls for: a lock is a row of stock_locks (sql/*/00003) in
// the service's own database, on PostgreSQL or MySQL/MariaDB.
//
//   - No expiry → a lease: the row says until when it is held, on the
//     database's clock (never an instance's, so a skewed instance cannot
//     steal a lease), and a heartbeat renews it while held.
//   - No owner → an owner column: renew and release apply only to the
//     owner's own row.
//   - Not reentrant → an owner re-enters and counts its holds (in its own
//     process, where the leases are: a count in the row would need a round
//     trip per re-entry, and one whose answer was lost would leave the row
//     counting a hold nobody has).
//   - Not blocking → a waiter polls with backoff, bounded (one goroutine per
//     process polls; the others queue behind it in the process).
//   - No fencing → the row's token column is a counter (the textbook
//     version) that grows with every holder; it fences the stock write.
//
// Taking a lock is one conditional statement (insert the row, or take
// over one that is free or whose lease has run out), so two contenders
// cannot both win. The row stays when the lock is released, because it
// carries the counter: a release clears the owner.
//
// What it does not cover: a statement delayed in the network for longer
// than a TTL (a partition that TCP outlasts) may still take a lock for a
// waiter that gave up and whose clean-up stopped trying; the lock then
// stays taken for one more TTL, by nobody. That costs availability on one
// name, never safety.
//
// Invariant: a holder's lease context ends (ErrLockLost) no later than the
// moment the database may hand the lock to another, because the holder
// counts its lease from before it sent the statement that set it, and the
// database from when it ran it. A holder that does not learn it in time (a
// paused process) is refused by the fence: the next holder's token is
// greater.
package dblock

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/handoff"
)

// table is the lock table of one engine: each method is one statement,
// written out per engine in postgres.go and mysql.go.
type table interface {
	// acquire takes name for owner if it is free or its lease ran out,
	// with the next token; ok false: someone holds it.
	acquire(ctx context.Context, name, owner string, ttl time.Duration) (token int64, ok bool, err error)
	// handOver passes name, still held by from, to to with the next token.
	handOver(ctx context.Context, name, from, to string, ttl time.Duration) (token int64, ok bool, err error)
	// renew extends owner's unexpired lease to ttl from now.
	renew(ctx context.Context, name, owner string, ttl time.Duration) (bool, error)
	// release frees owner's unexpired lock, or keeps it until keep after
	// it was taken.
	release(ctx context.Context, name, owner string, keep time.Duration) (bool, error)
	// abandon frees name if owner has it (an acquisition whose answer was
	// lost).
	abandon(ctx context.Context, name, owner string) error
	reset(ctx context.Context, name string) error
	advanceFence(ctx context.Context, name string, atLeast int64) error
	ping(ctx context.Context) error
	addr() string
	close()
}

// Locker hands out the locks of one database. It is safe for concurrent
// use; use one per process.
type Locker struct {
	cfg      config
	table    table
	queue    *handoff.Queue[*hold]
	closeCtx context.Context
	closeAll context.CancelFunc
	wg       sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	holds     map[*hold]struct{}
	released  *recentNames // names this process freed in the table a moment ago
	contested *recentNames // names this process found held by another lately
}

// Open connects to the database of databaseURL (postgres://, postgresql://
// or mysql://) with a small pool of the Locker's own. The schema must be
// migrated (the service does it at start). Close the Locker when done.
func Open(ctx context.Context, databaseURL string, opts ...Option) (*Locker, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.ownerPrefix == "" {
		host, _ := os.Hostname()
		cfg.ownerPrefix = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	var (
		t   table
		err error
	)
	switch scheme, _, _ := strings.Cut(databaseURL, "://"); scheme {
	case "postgres", "postgresql":
		t, err = openPostgres(ctx, databaseURL, cfg.maxConns)
	case "mysql":
		t, err = openMySQL(databaseURL, cfg.maxConns)
	default:
		err = fmt.Errorf("dblock: DATABASE_URL must start with postgres://, postgresql:// or mysql://, not %q", scheme)
	}
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(context.Background())
	return &Locker{
		cfg:       cfg,
		table:     t,
		queue:     handoff.New[*hold](),
		closeCtx:  cctx,
		closeAll:  cancel,
		holds:     make(map[*hold]struct{}),
		released:  newRecentNames(cfg.pollMax),
		contested: newRecentNames(contestWindow(cfg.pollMax)),
	}, nil
}

func (l *Locker) newOwner() string {
	b := make([]byte, 8)
	_, _ = crand.Read(b)
	return l.cfg.ownerPrefix + "/" + hex.EncodeToString(b)
}

// Acquire takes the lock named name, waiting while it is held: until ctx's
// deadline, or for WithWait's bound (default twice the TTL) if ctx has
// none. If ctx comes from a Lease of the same name and Locker, Acquire
// re-enters it: another Lease of the same hold and token, counted in the
// row; the lock is released with the last of them.
//
// A wait that ends fails with errors.Join(locking.ErrNotObtained,
// ctx.Err()); a database that fails a statement fails it at once with a
// locking.NodeError.
func (l *Locker) Acquire(ctx context.Context, name string) (*Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(locking.ErrNotObtained, err)
	}
	if h, ok := locking.HoldOf[*hold](ctx, l, name); ok {
		if le := l.reenter(h); le != nil {
			return le, nil
		}
	}
	if l.isClosed() {
		return nil, errors.Join(locking.ErrNotObtained, locking.ErrClosed)
	}
	wctx, cancel := locking.WaitContext(ctx, 0, l.cfg.waitBound(), l.closeCtx)
	defer cancel()

	turn, err := l.queue.Wait(wctx, name, func(t handoff.Turn[*hold]) { l.endTurn(name, t) })
	if err != nil {
		return nil, locking.NotObtained(wctx, l.closeCtx)
	}
	if turn.Handed {
		return l.start(ctx, turn.Hold), nil
	}
	h, err := l.obtain(wctx, name)
	if err != nil {
		l.queue.Done(name)
		return nil, locking.NotObtained(wctx, l.closeCtx, err)
	}
	// The goroutines that queued while this one waited go first, then
	// the lock returns to the table: the other processes poll there.
	h.budget = l.queue.Waiting(name)
	return l.start(ctx, h), nil
}

// reenter counts another lease of h, if h is still held: not released,
// not lost, its deadline ahead. nil: the caller waits for the lock afresh.
func (l *Locker) reenter(h *hold) *Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.refs == 0 || h.ctx.Err() != nil || !time.Now().Before(h.deadline) {
		return nil
	}
	h.refs++
	return &Lease{l: l, h: h}
}

// obtain polls the table until name is this process's.
func (l *Locker) obtain(wctx context.Context, name string) (*hold, error) {
	wait := l.cfg.pollMin
	if l.courtesy(name) {
		// This process freed name a moment ago with goroutines still
		// queued: let the other processes, polling, have their turn.
		wait = l.cfg.pollMax
		if backoff.Wait(wctx, wait) != nil {
			return nil, wctx.Err()
		}
	}
	for {
		owner := l.newOwner()
		sent := time.Now()
		token, ok, err := l.table.acquire(wctx, name, owner, l.cfg.ttl)
		if err != nil {
			// The statement may have run, its answer lost: free the row
			// if it is ours, or it would hold everyone up for a TTL.
			l.abandon(name, owner, sent.Add(l.cfg.ttl))
			if wctx.Err() != nil {
				return nil, wctx.Err()
			}
			return nil, l.nodeError(fmt.Errorf("acquire %s: %w", name, err))
		}
		if ok {
			deadline := l.leaseFrom(sent)
			if time.Now().Before(deadline) {
				return &hold{name: name, owner: owner, token: token, deadline: deadline}, nil
			}
			// The answer came after the lease it set may have run out
			// (found by review): another may hold the lock already.
			// Let it go and poll again.
			l.abandon(name, owner, sent.Add(l.cfg.ttl))
		}
		l.mu.Lock()
		l.contested.mark(name, time.Now())
		l.mu.Unlock()
		if backoff.Wait(wctx, backoff.Jitter(wait)) != nil {
			return nil, wctx.Err()
		}
		wait = min(2*wait, l.cfg.pollMax)
	}
}

// contestWindow is how long a name counts as wanted by other processes
// after this one last found it held by another.
func contestWindow(pollMax time.Duration) time.Duration { return 100 * pollMax }

// courtesy reports whether this process should let the others poll first:
// it freed name a moment ago, and other processes have been taking it
// lately (so they are likely polling now). A process alone on a name takes
// it back at once.
func (l *Locker) courtesy(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	return l.released.within(name, now) && l.contested.within(name, now)
}

// abandon frees name if owner got it after all, on a goroutine of the
// Locker's, retried until it succeeds, the lease it may have set ran out
// (until), or the Locker closes.
func (l *Locker) abandon(name, owner string, until time.Time) {
	l.spawn(func() {
		wait := l.cfg.pollMin
		for time.Now().Before(until) {
			ctx, cancel := context.WithDeadline(l.closeCtx, until)
			err := l.table.abandon(ctx, name, owner)
			cancel()
			if err == nil || backoff.Wait(l.closeCtx, backoff.Jitter(wait)) != nil {
				return
			}
			wait = min(2*wait, l.cfg.pollMax)
		}
	})
}

func (l *Locker) spawn(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.wg.Go(f)
}

// Reset frees name whoever holds it, for a new sale: the holder's next
// renewal (within LOCK_RENEW_EVERY) finds it gone and its lease ends. Until
// then the old holder and a new one may both hold leases: the new one's
// token is greater, so the stock row's fence refuses the old one's write,
// as for a paused holder. Tokens keep growing.
func (l *Locker) Reset(ctx context.Context, name string) error {
	if err := l.table.reset(ctx, name); err != nil {
		return l.nodeError(fmt.Errorf("reset %s: %w", name, err))
	}
	return nil
}

// AdvanceFence makes every later token of name greater than atLeast.
func (l *Locker) AdvanceFence(ctx context.Context, name string, atLeast int64) error {
	if err := l.table.advanceFence(ctx, name, atLeast); err != nil {
		return l.nodeError(fmt.Errorf("advance the fence of %s: %w", name, err))
	}
	return nil
}

// Ping checks that the database answers and has the lock table.
func (l *Locker) Ping(ctx context.Context) error {
	if err := l.table.ping(ctx); err != nil {
		return l.nodeError(err)
	}
	return nil
}

func (l *Locker) nodeError(err error) error {
	return &locking.NodeError{Node: l.table.addr(), Err: err}
}

func (l *Locker) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// Close ends every lease (ErrLockLost, ErrClosed), frees their rows if the
// database answers within a second, waits for the Locker's goroutines and
// closes its pool.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return locking.ErrClosed
	}
	l.closed = true
	held := make([]*hold, 0, len(l.holds))
	for h := range l.holds {
		held = append(held, h)
	}
	l.mu.Unlock()
	l.closeAll()
	l.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, h := range held {
		_ = l.table.abandon(ctx, h.name, h.owner)
	}
	l.table.close()
	return nil
}
