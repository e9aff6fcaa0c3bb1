// Package semaphore is a fair distributed semaphore on Redis: at most N
// holders of a name at once across processes, each with a permit id and a
// lease, admitted in the order they asked (a ticket from a counter, not a
// clock, so skewed instances queue fairly).
//
// It is the textbook shared lock (many holders) next to the exclusive ones.
// The service puts it in front of the SQL strategies (ADMISSION_LIMIT): it
// bounds how many orders of one SKU are in the database at once, across
// every instance, because the hot row commits more from few connections
// than from many. It orders nothing and guards nothing: the strategies'
// own writes stay safe whatever it admits.
//
// One Lua script per attempt keeps, under one hash tag per name:
//
//   - holders: permit id → lease end (ms, Redis's clock);
//   - queue: waiting permit id → ticket;
//   - seen: waiting permit id → when its waiter stops counting (a waiter
//     that died stops asking, and leaves the queue after the wait lease);
//   - ticket: the counter.
//
// A waiter is admitted when fewer than N hold and it is among the first
// free-places waiters by ticket. A holder that dies frees its place when its
// lease ends. A release publishes on the name's channel, and each process's
// one subscription wakes its waiters of that name at once; they also ask
// again every poll interval, for the places that free by expiry and for a
// message lost to a reconnection. Every key expires a while after its last
// use, so that names nobody asks for any more leave nothing behind.
//
// The limit holds across a Redis restart only if Redis keeps its data (an
// append-only file): a Redis that comes back empty has forgotten the
// holders, and up to N more are admitted while the earlier ones finish,
// for at most one lease. In the service that lapse is harmless to the
// stock (admission guards nothing) and costs only the bound it keeps.
package semaphore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/backoff"
)

// ErrNotAdmitted: the wait ended before a place freed. It is joined with
// the context's error.
var ErrNotAdmitted = errors.New("semaphore: not admitted")

// Each script's source is a file in lua/, embedded byte for byte: Redis
// knows a script by the SHA1 of its source (EVALSHA), so a file keeps its
// leading and trailing newlines and gains no header; the comments here are
// the scripts' documentation.

//go:embed lua/enter.lua
var enterSource string

// enter: drop the holders whose lease ended and the waiters that stopped
// asking; queue the caller (or refresh it); admit it if a place is free
// for it.
//
// KEYS: holders, queue, seen, ticket. ARGV: permit id, limit, lease ms,
// wait lease ms. Returns 1 if admitted, else -(1 + its place in the
// queue).
var enter = redis.NewScript(enterSource)

//go:embed lua/leave.lua
var leaveSource string

// leave: the holder gives its place back, or the waiter leaves the queue;
// either may let a waiter in, so the name's waiters are woken (KEYS[5] is
// the channel). Returns 1 if the id held a place whose lease had not ended
// (a late release finds its place already given up: found by review).
var leave = redis.NewScript(leaveSource)

// Semaphore hands out the permits of one Redis server. Close it to stop
// its subscription.
type Semaphore struct {
	rdb       *redis.Client
	limit     int
	lease     time.Duration
	waitLease time.Duration
	pollMin   time.Duration
	pollMax   time.Duration
	prefix    string

	ps       *redis.PubSub
	listened chan struct{} // closed when the subscription's reader ends

	stop     chan struct{} // closed by Close: ends the background withdrawals
	stopOnce sync.Once
	wg       sync.WaitGroup // the background withdrawals (abandon)
	mu       sync.Mutex
	wakes    map[string]*wake // the names this process's waiters wait for
}

// wake is the signal of one name's release to this process's waiters: c is
// closed (and the wake forgotten) at the next message.
type wake struct {
	c    chan struct{}
	refs int
}

// Option configures a Semaphore.
type Option func(*Semaphore)

// WithLease sets how long a permit lasts unless released: the longest a
// dead holder keeps its place. Holders do not renew, so it must outlast a
// hold (the service sets it from ORDER_TIMEOUT). The default is 10s.
func WithLease(d time.Duration) Option {
	return func(s *Semaphore) {
		if d > 0 {
			s.lease = d
		}
	}
}

// WithPoll sets how often a waiter asks again without being woken: first
// after least, then up to most, jittered. Releases wake the waiters at
// once; polling finds the places that free by a lease's end. The defaults
// are 5ms and 50ms.
func WithPoll(least, most time.Duration) Option {
	return func(s *Semaphore) {
		if least > 0 && most >= least {
			s.pollMin, s.pollMax = least, most
		}
	}
}

// WithPrefix sets the prefix of the semaphore's keys. The default is
// "sem:".
func WithPrefix(p string) Option { return func(s *Semaphore) { s.prefix = p } }

// New returns a semaphore of limit places per name on rdb, subscribed to
// its releases.
func New(rdb *redis.Client, limit int, opts ...Option) (*Semaphore, error) {
	if limit < 1 {
		return nil, fmt.Errorf("semaphore: limit %d, want at least 1", limit)
	}
	s := &Semaphore{rdb: rdb, limit: limit, lease: 10 * time.Second, pollMin: 5 * time.Millisecond,
		pollMax: 50 * time.Millisecond, prefix: "sem:", wakes: map[string]*wake{}, listened: make(chan struct{}),
		stop: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	// A waiter asks at least every pollMax; one that has not asked for
	// many of those is gone.
	s.waitLease = max(20*s.pollMax, time.Second)
	s.ps = rdb.PSubscribe(context.Background(), s.prefix+"*"+freedSuffix)
	go s.listen()
	return s, nil
}

const freedSuffix = ":freed"

// listen wakes the waiters of each name whose release it hears, until
// Close. go-redis subscribes again after a reconnection; what was
// published meanwhile is found by polling.
func (s *Semaphore) listen() {
	defer close(s.listened)
	for msg := range s.ps.Channel() {
		name := strings.TrimSuffix(strings.TrimPrefix(msg.Channel, s.prefix), freedSuffix)
		name = strings.TrimSuffix(strings.TrimPrefix(name, "{"), "}")
		s.mu.Lock()
		if w := s.wakes[name]; w != nil {
			close(w.c)
			w.c = make(chan struct{})
		}
		s.mu.Unlock()
	}
}

// waitFor returns the channel closed at name's next release, and the
// function to call when done waiting.
func (s *Semaphore) waitFor(name string) (<-chan struct{}, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.wakes[name]
	if w == nil {
		w = &wake{c: make(chan struct{})}
		s.wakes[name] = w
	}
	w.refs++
	return w.c, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if w.refs--; w.refs == 0 {
			delete(s.wakes, name)
		}
	}
}

// Close stops the subscription and waits for its reader.
func (s *Semaphore) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	s.wg.Wait()
	err := s.ps.Close()
	<-s.listened
	return err
}

// Limit is the number of places per name.
func (s *Semaphore) Limit() int { return s.limit }

func (s *Semaphore) keys(name string) []string {
	tag := s.prefix + "{" + name + "}"
	return []string{tag + ":holders", tag + ":queue", tag + ":seen", tag + ":ticket", tag + freedSuffix}
}

// Permit is one place of a name.
type Permit struct {
	s    *Semaphore
	name string
	// ID is the permit's id: the holder's identity in Redis.
	ID string
}

// Acquire waits for a place of name, in the order of asking, until ctx
// ends (ErrNotAdmitted joined with ctx's error). A failing Redis fails it
// at once with Redis's error; a place it may have taken then frees at its
// lease's end.
func (s *Semaphore) Acquire(ctx context.Context, name string) (*Permit, error) {
	p := &Permit{s: s, name: name, ID: uuid.NewString()}
	keys := s.keys(name)[:4]
	wait := s.pollMin
	for {
		// Armed before asking: a release between the answer and the
		// wait below is not missed.
		woken, done := s.waitFor(name)
		n, err := enter.Run(ctx, s.rdb, keys, p.ID, s.limit, s.lease.Milliseconds(), s.waitLease.Milliseconds()).Int64()
		if err != nil {
			done()
			s.abandon(ctx, p)
			if ctx.Err() != nil {
				return nil, errors.Join(ErrNotAdmitted, context.Cause(ctx))
			}
			return nil, fmt.Errorf("semaphore %s: %w", name, err)
		}
		if n == 1 {
			done()
			return p, nil
		}
		t := time.NewTimer(backoff.Jitter(wait))
		select {
		case <-woken:
		case <-t.C:
			wait = min(2*wait, s.pollMax)
		case <-ctx.Done():
			t.Stop()
			done()
			s.abandon(ctx, p)
			return nil, errors.Join(ErrNotAdmitted, context.Cause(ctx))
		}
		t.Stop()
		done()
	}
}

// abandon leaves the queue (or a place taken whose answer was lost), with a
// short deadline of its own: the caller's has passed. When Redis does not
// answer in time, the ask still in flight may admit the permit once Redis
// runs it, after Acquire has reported ErrNotAdmitted (found by review: a
// place nobody holds, counted until its lease ends). So the withdrawal goes
// on in the background until Redis answers it, and once more a moment
// later, for an ask that Redis runs after it.
func (s *Semaphore) abandon(ctx context.Context, p *Permit) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 500*time.Millisecond)
	err := leave.Run(actx, s.rdb, s.keys(p.name), p.ID).Err()
	cancel()
	if err == nil {
		return
	}
	s.wg.Add(1)
	go s.withdraw(p, time.Now().Add(s.lease+s.waitLease))
}

// withdraw sends p's leave until Redis has answered it twice, 100ms apart,
// or until no place p could have taken would still count (its lease), or
// until Close.
func (s *Semaphore) withdraw(p *Permit, until time.Time) {
	defer s.wg.Done()
	wait, answered := 50*time.Millisecond, 0
	for answered < 2 && time.Now().Before(until) {
		t := time.NewTimer(wait)
		select {
		case <-s.stop:
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if leave.Run(ctx, s.rdb, s.keys(p.name), p.ID).Err() == nil {
			answered, wait = answered+1, 100*time.Millisecond
		} else {
			wait = min(2*wait, time.Second)
		}
		cancel()
	}
}

// Release gives the place back. It reports false when the permit no longer
// held one (its lease had ended).
func (p *Permit) Release(ctx context.Context) (bool, error) {
	n, err := leave.Run(ctx, p.s.rdb, p.s.keys(p.name), p.ID).Int64()
	if err != nil {
		return false, fmt.Errorf("semaphore %s: release: %w", p.name, err)
	}
	return n == 1, nil
}

// Ping checks that Redis answers.
func (s *Semaphore) Ping(ctx context.Context) error { return s.rdb.Ping(ctx).Err() }

// Holders counts the places of name held now (expired ones included until
// the next Acquire drops them), for tests and operators.
func (s *Semaphore) Holders(ctx context.Context, name string) (int64, error) {
	return s.rdb.ZCard(ctx, s.keys(name)[0]).Result()
}
