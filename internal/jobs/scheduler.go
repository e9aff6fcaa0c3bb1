// Package jobs runs periodic jobs on exactly one instance of the service per
// period: every instance ticks, and the one that takes the job's lock runs
// it. The lock has ShedLock's two bounds: "at most for" (a runner that
// crashed mid-job frees it then) and "at least for" (the lock stays taken
// that long after it was taken, so that an instance whose clock ticks
// earlier or later than the runner's does not run the job again in the
// same period). Both are judged by the lock's own clock (the database's,
// for the lock table), never by an instance's.
package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Lock is the single-run lock the scheduler takes for a job's period.
type Lock interface {
	// TryLock takes name without waiting, for at most atMost; ok is false
	// when another instance has it.
	TryLock(ctx context.Context, name string, atMost time.Duration) (held Held, ok bool, err error)
}

// Held is one run's hold of a job lock.
type Held interface {
	// Context ends when the hold's "at most" has run out: the job must stop.
	Context() context.Context
	// Unlock frees the lock, but not before atLeast after it was taken.
	Unlock(ctx context.Context, atLeast time.Duration) error
}

// LockOf adapts a lock whose TryLock returns its own hold type
// (dblock.Locker.TryLock, redislock.JobLocker.TryLock) to Lock.
func LockOf[H Held](try func(ctx context.Context, name string, atMost time.Duration) (H, bool, error)) Lock {
	return LockFunc(func(ctx context.Context, name string, atMost time.Duration) (Held, bool, error) {
		h, ok, err := try(ctx, name, atMost)
		if !ok {
			return nil, false, err // never a typed nil in the interface
		}
		return h, true, nil
	})
}

// LockFunc adapts a function to Lock.
type LockFunc func(ctx context.Context, name string, atMost time.Duration) (Held, bool, error)

// TryLock implements Lock.
func (f LockFunc) TryLock(ctx context.Context, name string, atMost time.Duration) (Held, bool, error) {
	return f(ctx, name, atMost)
}

// Job is a periodic job.
type Job struct {
	// Name names the job in the lock ("job:<name>"), the logs and the
	// metrics.
	Name string
	// Every is the period: each instance ticks at the multiples of it on
	// its own clock.
	Every time.Duration
	// AtMostFor bounds a run: its context ends then, and a runner that
	// crashed frees the job then. Default: Every.
	AtMostFor time.Duration
	// AtLeastFor keeps the lock taken that long after a run began, however
	// fast the run. Default: nine tenths of Every, so that instances whose
	// clocks differ by less than that still run the job once a period. It
	// must leave a twentieth of the period (the lock's own latency), or the
	// runner's next tick would find its own lock and skip a period, and it
	// may not exceed AtMostFor.
	AtLeastFor time.Duration
	// Run is the job.
	Run func(ctx context.Context) error
}

func (j Job) withDefaults() Job {
	if j.AtMostFor <= 0 {
		j.AtMostFor = j.Every
	}
	if j.AtLeastFor <= 0 {
		j.AtLeastFor = j.Every - j.Every/10
	}
	return j
}

// Observer hears about runs, for metrics.
type Observer interface {
	// JobAdded reports a job added to the scheduler.
	JobAdded(job string)
	// JobRan reports a run on this instance: when it began, how long it
	// took, and its error (nil when it succeeded).
	JobRan(job string, began time.Time, took time.Duration, err error)
}

type nopObserver struct{}

func (nopObserver) JobAdded(string)                                {}
func (nopObserver) JobRan(string, time.Time, time.Duration, error) {}

// Scheduler runs jobs on one instance.
type Scheduler struct {
	lock  Lock
	log   *slog.Logger
	obs   Observer
	clock func() time.Time
	jobs  []Job
}

// Option configures a Scheduler.
type Option func(*Scheduler)

// WithLogger sets where failed runs are logged. Default: slog.Default().
func WithLogger(l *slog.Logger) Option { return func(s *Scheduler) { s.log = l } }

// WithObserver sets who hears about runs. Default: nobody.
func WithObserver(o Observer) Option { return func(s *Scheduler) { s.obs = o } }

// WithClock sets the instance's clock, which places the ticks. Default:
// time.Now. Tests give it an offset, as a skewed instance has.
func WithClock(now func() time.Time) Option { return func(s *Scheduler) { s.clock = now } }

// New returns a scheduler of jobs over lock.
func New(lock Lock, opts ...Option) *Scheduler {
	s := &Scheduler{lock: lock, log: slog.Default(), obs: nopObserver{}, clock: time.Now}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Add adds a job; call it before Run. A job whose period is not positive
// is refused.
func (s *Scheduler) Add(j Job) error {
	if j.Every <= 0 || j.Run == nil || j.Name == "" {
		return fmt.Errorf("jobs: job %q needs a name, a positive period and a function", j.Name)
	}
	j = j.withDefaults()
	// Found by review: a default "at least" silently cut to a short "at
	// most", and an "at least" of a whole period, broke once a period.
	if j.AtLeastFor > j.Every-j.Every/20 {
		return fmt.Errorf("jobs: job %q: at least for %v leaves less than a twentieth of its period %v: its runner would skip periods", j.Name, j.AtLeastFor, j.Every)
	}
	if j.AtMostFor < j.AtLeastFor {
		return fmt.Errorf("jobs: job %q: at most for %v is shorter than at least for %v", j.Name, j.AtMostFor, j.AtLeastFor)
	}
	s.jobs = append(s.jobs, j)
	s.obs.JobAdded(j.Name)
	return nil
}

// Run ticks every job until ctx ends, then waits for the runs under way to
// stop (their contexts end with ctx).
func (s *Scheduler) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, j := range s.jobs {
		wg.Go(func() { s.loop(ctx, j) })
	}
	wg.Wait()
}

func (s *Scheduler) loop(ctx context.Context, j Job) {
	for {
		now := s.clock()
		next := now.Truncate(j.Every).Add(j.Every)
		t := time.NewTimer(next.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		s.Once(ctx, j)
	}
}

// Once takes j's lock and runs j if no other instance has it, and reports
// whether it ran here.
// j must have been accepted by Add.
func (s *Scheduler) Once(ctx context.Context, j Job) bool {
	j = j.withDefaults()
	held, ok, err := s.lock.TryLock(ctx, "job:"+j.Name, j.AtMostFor)
	if err != nil {
		s.log.Warn("job lock failed; the job runs on another instance or in the next period", "job", j.Name, "err", err)
		return false
	}
	if !ok {
		return false
	}
	began := time.Now()
	runCtx, cancel := context.WithCancelCause(held.Context())
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	runErr := j.Run(runCtx)
	stop()
	cancel(nil)
	took := time.Since(began)
	s.obs.JobRan(j.Name, began, took, runErr)
	if runErr != nil {
		s.log.Error("job failed", "job", j.Name, "took", took, "err", runErr)
	}
	// The lock frees by itself at its "at most": a shutdown (ctx ended)
	// does not wait long for a database that does not answer.
	bound := 5 * time.Second
	if ctx.Err() != nil {
		bound = 500 * time.Millisecond
	}
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
	defer ucancel()
	if err := held.Unlock(uctx, j.AtLeastFor); err != nil && !errors.Is(err, context.Canceled) {
		s.log.Warn("job lock release failed; it frees by itself at its longest", "job", j.Name, "err", err)
	}
	return true
}
