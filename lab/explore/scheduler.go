package explore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// An entity is one thread of control the scheduler decides for: a buyer, or
// the transaction of a buyer whose commit answer was lost and which now
// commits on its own, later.
type entity struct {
	id    int
	name  string
	buyer int
	// resume carries the scheduler's grant to the entity parked at a step.
	resume chan grant

	// The fields below belong to the scheduler's goroutine.
	state   entityState
	at      string // the step it is parked at
	session int64  // database session of its open transaction, 0 for none
	// locks: its open transaction has run a statement that takes row
	// locks, so a further one of them does not queue behind another.
	locks bool
	token int64 // at a release: the token of the lease it gives back
	// asleep counts the waits in the process it announced minus the
	// wake-ups announced for it.
	asleep int
}

type entityState int

const (
	running entityState = iota // executing between two steps
	parked                     // waiting at a step for a grant
	blocked                    // waiting inside the database for a lock
	queued                     // waiting in the process for another entity (a batch's leader)
	done                       // finished
)

// Steps an entity parks at. A step runs from the grant to the next park:
// the named call and whatever the code does until its next step.
const (
	stepAcquire    = "acquire"
	stepRelease    = "release"
	stepRead       = "read"
	stepLockRead   = "read for update"
	stepWrite      = "write"
	stepCommit     = "commit"
	stepLateCommit = "late commit"
	stepFindOrder  = "find order"
	// stepResolve: the lookup of an order whose commit answer was lost,
	// which waits for every transaction that holds the SKU's row (a late
	// commit among them).
	stepResolve   = "resolve a lost commit"
	stepIdemRead  = "read idempotency key"
	stepIdemWrite = "write idempotency key"
	stepJoin      = "join the batch queue"
	// The order lifecycle's: a transition of a held order ("settle paid",
	// "settle cancelled", "settle expired"), the return of its units, one
	// sweep of lapsed holds, and a hold lapsing (a clock's step).
	stepSettle = "settle"
	stepReturn = "return units"
	stepSweep  = "sweep lapsed holds"
	stepLapse  = "lapses"
	stepClaim  = "claim buyer's units"
	// stepBound: the sold-out mark's bound passes (SOLD_OUT_TTL, a
	// clock's step): a mark set before it refuses no more.
	stepBound = "bound passes"
)

// grant is the scheduler's answer to a parked entity.
type grant struct {
	// loseAnswer, at a commit: report the outcome as unknown to the buyer
	// now, and commit later as late, an entity of its own.
	loseAnswer bool
	late       *entity
	// token, at an acquire: the fencing token of the new lease.
	token int64
	// held, at a release: whether the lease still held the lock.
	held bool
	// abort: the schedule is abandoned; the step fails with errAborted so
	// that the buyer's transaction rolls back and it returns.
	abort bool
}

// errAborted is what a step returns when its schedule was abandoned.
var errAborted = errors.New("explore: schedule abandoned")

// event is what the entities tell the scheduler.
type event struct {
	e       *entity
	kind    eventKind
	step    string
	session int64
	token   int64
}

type eventKind int

const (
	evParked     eventKind = iota // at a step, waiting for a grant
	evSessionEnd                  // its transaction ended
	evDone                        // finished
	evAsleep                      // it waits in the process until another wakes it
	evWoken                       // another is about to wake it
)

// A choice is one thing the scheduler may do next.
type choice struct {
	e          *entity // nil for the loss of the lock
	loseAnswer bool
	loseLease  bool
	// rollBack, at a late commit: the COMMIT never landed.
	rollBack bool
}

func (c choice) String() string {
	switch {
	case c.loseLease:
		return "lock expires"
	case c.loseAnswer:
		return c.e.name + ": " + c.e.at + ", answer lost"
	case c.rollBack:
		return c.e.name + ": rolled back"
	}
	return c.e.name + ": " + c.e.at
}

// Blocked tells whether a database session waits for a lock held by another.
type Blocked func(ctx context.Context, session int64) (bool, error)

// scheduler runs one schedule: it lets one entity at a time move from one
// step to the next, and holds the model of the lock.
type scheduler struct {
	events   chan event
	entities []*entity
	blocked  Blocked
	stuck    time.Duration

	faultsLeft    int
	mayLoseAnswer bool // whether a commit's answer may be lost
	mayLoseLease  bool // whether the lock may expire under its holder

	// The lock: who holds it (-1: nobody), under which token.
	holder     int
	holderTok  int64
	lastToken  int64
	faultsUsed int
	trace      []string
	// Which buyers a fault struck: whose lock expired under them, whose
	// commit answer was lost. Only they may be answered busy or
	// unavailable.
	expired    map[int]bool
	lostAnswer map[int]bool
}

func newScheduler(blocked Blocked, f Faults) *scheduler {
	return &scheduler{
		events:        make(chan event, 64),
		blocked:       blocked,
		stuck:         20 * time.Second,
		faultsLeft:    f.Max,
		mayLoseAnswer: f.LostCommitAnswer,
		mayLoseLease:  f.LeaseExpiry,
		holder:        -1,
		lastToken:     100,
		expired:       map[int]bool{},
		lostAnswer:    map[int]bool{},
	}
}

// newEntity registers an entity; only the scheduler's goroutine calls it.
func (s *scheduler) newEntity(name string, buyer int) *entity {
	e := &entity{id: len(s.entities), name: name, buyer: buyer, resume: make(chan grant, 1)}
	s.entities = append(s.entities, e)
	return e
}

// park is called by an entity at a step: it waits for the scheduler's grant.
func (s *scheduler) park(e *entity, step string, session int64) grant {
	s.events <- event{e: e, kind: evParked, step: step, session: session}
	return <-e.resume
}

// parkRelease is park for the release of the lease with token.
func (s *scheduler) parkRelease(e *entity, token int64) grant {
	s.events <- event{e: e, kind: evParked, step: stepRelease, token: token}
	return <-e.resume
}

func (s *scheduler) apply(ev event) {
	switch ev.kind {
	case evParked:
		ev.e.state, ev.e.at, ev.e.session, ev.e.token = parked, ev.step, ev.session, ev.token
	case evSessionEnd:
		ev.e.session, ev.e.locks = 0, false
	case evDone:
		ev.e.state, ev.e.session, ev.e.locks = done, 0, false
	case evAsleep, evWoken:
		// Counted, not toggled: the waker may announce the wake-up
		// before the sleeper has announced its sleep.
		if ev.kind == evAsleep {
			ev.e.asleep++
		} else {
			ev.e.asleep--
		}
		switch {
		case ev.e.asleep > 0 && ev.e.state == running:
			ev.e.state = queued
		case ev.e.asleep <= 0 && ev.e.state == queued:
			ev.e.state = running
		}
	}
}

// sleep and wake are what a strategy that queues buyers in the process
// calls (batched.QueueObserver): a buyer about to wait for another's
// work, and the one that wakes it, before it does. A buyer asleep is not
// waited for; one about to wake is, from the moment the waker says so,
// which comes before the waker's own next step.
func (s *scheduler) sleep(e *entity) { s.events <- event{e: e, kind: evAsleep} }
func (s *scheduler) wake(e *entity)  { s.events <- event{e: e, kind: evWoken} }

// takesLocks reports whether a step runs a statement that may wait for
// another transaction's row lock.
func takesLocks(step string) bool {
	switch step {
	case stepWrite, stepLockRead, stepIdemWrite, stepReturn, stepSweep, stepLapse, stepClaim, stepResolve:
		return true
	}
	return strings.HasPrefix(step, stepSettle+" ")
}

// choices lists what may happen next, in a fixed order so that a schedule
// replays the same.
//
// While one buyer waits inside the database for a row lock, no other may
// start a statement that could queue behind the same lock: two waiters wake
// in an order the server picks, not the scheduler, and the schedule would
// not replay. What that leaves out is only when the second waiter's
// statement started, not the order of the writes: a waiting UPDATE or
// SELECT … FOR UPDATE evaluates the row as the first waiter left it
// (PostgreSQL's READ COMMITTED recheck, InnoDB's locking read), as it would
// had it started after the first waiter woke, which is a schedule that is
// explored. A buyer whose transaction already holds row locks may go on.
func (s *scheduler) choices() []choice {
	someoneWaits := false
	for _, e := range s.entities {
		someoneWaits = someoneWaits || e.state == blocked
	}
	var cs []choice
	for _, e := range s.entities {
		if e.state != parked {
			continue
		}
		if e.at == stepAcquire && s.holder >= 0 {
			continue // waits for the lock
		}
		if someoneWaits && takesLocks(e.at) && !e.locks {
			continue
		}
		cs = append(cs, choice{e: e})
		if (e.at == stepCommit || e.at == stepReserve) && s.mayLoseAnswer && s.faultsLeft > 0 {
			cs = append(cs, choice{e: e, loseAnswer: true})
		}
		if e.at == stepLateCommit {
			cs = append(cs, choice{e: e, rollBack: true})
		}
	}
	if s.holder >= 0 && s.mayLoseLease && s.faultsLeft > 0 {
		cs = append(cs, choice{loseLease: true})
	}
	return cs
}

// do carries out a choice and waits until nothing moves any more.
func (s *scheduler) do(ctx context.Context, c choice) error {
	s.trace = append(s.trace, c.String())
	if c.loseLease {
		// The holder is not told: it is paused, or its watchdog has not
		// noticed yet. The worst case for the write it may still send. (A
		// holder that is told has its work cancelled, which the drivers
		// carry out asynchronously — database/sql rolls back on a
		// goroutine of its own — so no schedule of it would replay; the
		// store's deadline tests and TestLeaseLostBeforeCommit cover it.)
		s.expired[s.holder] = true
		s.holder = -1
		s.faultsLeft--
		s.faultsUsed++
		return s.settle(ctx)
	}
	e := c.e
	var g grant
	switch {
	case e.at == stepAcquire:
		s.lastToken++
		s.holder, s.holderTok = e.buyer, s.lastToken
		g.token = s.lastToken
	case e.at == stepRelease:
		g.held = s.holder == e.buyer && s.holderTok == e.token
		if g.held {
			s.holder = -1
		}
	case c.rollBack:
		g.abort = true
	case c.loseAnswer && e.at == stepReserve:
		// The script runs; its answer never reaches the buyer.
		s.faultsLeft--
		s.faultsUsed++
		g.loseAnswer = true
		s.lostAnswer[e.buyer] = true
	case c.loseAnswer:
		s.faultsLeft--
		s.faultsUsed++
		g.loseAnswer = true
		s.lostAnswer[e.buyer] = true
		g.late = s.newEntity(e.name+" (late commit)", e.buyer)
		g.late.state, g.late.session, g.late.locks = running, e.session, e.locks
		e.session, e.locks = 0, false
	}
	if takesLocks(e.at) {
		e.locks = true
	}
	e.state = running
	e.resume <- g
	return s.settle(ctx)
}

// settle waits until every entity is parked, done, or blocked inside the
// database behind another. Entities blocked before may move again after
// any step, so they are waited for too.
func (s *scheduler) settle(ctx context.Context) error {
	giveUp := time.Now().Add(s.stuck)
	poll := 50 * time.Microsecond
	for {
		var active []*entity
		for _, e := range s.entities {
			if e.state == running || e.state == blocked {
				active = append(active, e)
			}
		}
		if len(active) == 0 {
			return nil
		}
		timer := time.NewTimer(poll)
		select {
		case ev := <-s.events:
			timer.Stop()
			s.apply(ev)
			poll = 50 * time.Microsecond
			continue
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		}
		// Nothing arrived: is everyone who has not parked waiting on a
		// row lock? Then nothing moves until the next grant.
		all := true
		for _, e := range active {
			b := false
			if e.session != 0 {
				var err error
				if b, err = s.blocked(ctx, e.session); err != nil {
					return fmt.Errorf("ask the database whether %s waits: %w", e.name, err)
				}
			}
			if b {
				e.state = blocked
			} else {
				e.state, all = running, false
			}
		}
		if all {
			return nil
		}
		if time.Now().After(giveUp) {
			return fmt.Errorf("stuck: %s never reached its next step (after %s)", names(active), strings.Join(s.trace, ", "))
		}
		poll = min(2*poll, 2*time.Millisecond)
	}
}

// drive runs the schedule from here until no entity can move, asking pick
// at each choice point, and returns for each of watched the depth at which
// it was done (1 for done before the first choice). A schedule that cannot
// go on (a replay that diverged, a step named that cannot happen, an
// entity that can never move again) is unwound, not left holding row
// locks, and its error returned.
func (s *scheduler) drive(ctx context.Context, pick picker, watched []*entity) ([]int64, error) {
	abandon := func(err error) ([]int64, error) {
		s.abort(ctx)
		return nil, err
	}
	returned := make([]int64, len(watched))
	if err := s.settle(ctx); err != nil {
		return abandon(err)
	}
	for depth := 0; ; depth++ {
		for i, e := range watched {
			if e.state == done && returned[i] == 0 {
				returned[i] = int64(depth + 1)
			}
		}
		cs := s.choices()
		if len(cs) == 0 {
			break
		}
		i, err := pick(depth, cs)
		if err != nil {
			return abandon(err)
		}
		if err := s.do(ctx, cs[i]); err != nil {
			return abandon(err)
		}
	}
	for _, e := range s.entities {
		if e.state != done {
			return abandon(fmt.Errorf("explore: %s can never move again (deadlock) after %s", e.name, strings.Join(s.trace, " → ")))
		}
	}
	return returned, nil
}

// abort ends an abandoned schedule: every parked entity is told its step
// failed, until all are done, so that no transaction is left open holding
// row locks and a connection. It gives up when an entity is stuck.
func (s *scheduler) abort(ctx context.Context) {
	for {
		if err := s.settle(ctx); err != nil {
			return
		}
		moved := false
		for _, e := range s.entities {
			if e.state == parked {
				e.state = running
				e.resume <- grant{abort: true}
				moved = true
			}
		}
		if !moved {
			return
		}
	}
}

func names(es []*entity) string {
	var n []string
	for _, e := range es {
		n = append(n, e.name)
	}
	sort.Strings(n)
	return strings.Join(n, ", ")
}

type entityKey struct{}

func withEntity(ctx context.Context, e *entity) context.Context {
	return context.WithValue(ctx, entityKey{}, e)
}

func entityOf(ctx context.Context) *entity {
	e, _ := ctx.Value(entityKey{}).(*entity)
	return e
}
