package jobs_test

// The bounds of the scheduler and the audit job: Run ends with its context,
// Add refuses bounds that break once a period, an audit cut short still
// reports what it found. Each drives its interleaving by hand (Once, hooks inside the job,
// the proxy's Freeze); the only sleeps wait out a lock's "at least for",
// which is what those tests are about.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/jobs"
	"github.com/flashsale/stock/lab/testdb"
)

// Run returns promptly when its context ends, also when a run is under way
// as the service shuts down on an instance whose database stopped
// answering: Run must not wait out the 5s of the Unlock's detached context.
//
// Interleaving: the job runs on the only instance; inside it the proxy
// freezes (the database stops answering) and Run's context is cancelled;
// the job returns at once on its context's end; Once then calls
// Unlock(context.WithoutCancel(ctx) + 5s), which would wait on the frozen
// connection for the full 5s; Run returns within 1s all the same.
func TestShutdownDoesNotWaitOnAFrozenUnlock(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine, func(t *testing.T) {
			dbURL := testdb.MigratedURL(t, engine)
			l, link := instance(t, dbURL)
			s := jobs.New(tableLock(l), jobs.WithLogger(quiet()))
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var stoppedAt time.Time
			_ = s.Add(jobs.Job{Name: "audit", Every: 100 * time.Millisecond, Run: func(rctx context.Context) error {
				link.Freeze()
				stoppedAt = time.Now()
				cancel() // shutdown
				<-rctx.Done()
				return context.Cause(rctx)
			}})
			done := make(chan struct{})
			go func() { defer close(done); s.Run(ctx) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return within 10s")
			}
			link.Thaw()
			if stoppedAt.IsZero() {
				t.Fatal("the job never ran")
			}
			if took := time.Since(stoppedAt); took > time.Second {
				t.Fatalf("Run returned %v after its context ended (the database frozen): not promptly", took.Round(time.Millisecond))
			}
		})
	}
}

// Add refuses the bounds that break "once a period", with two schedules.
// (a) An "at most" shorter than the default "at least" (0.9 period) would
// lower it: A, its clock 0.6 period ahead, runs at T; B ticks for the same
// period at T + 0.6 period and runs again. (b) An "at least" of 1.5
// periods: a single instance without skew finds its own kept lock at its
// next tick and runs every other period. The defaults are accepted.
func TestAddRefusesBoundsThatBreakOncePerPeriod(t *testing.T) {
	const every = 400 * time.Millisecond
	run := func(context.Context) error { return nil }
	s := jobs.New(jobs.LockFunc(func(context.Context, string, time.Duration) (jobs.Held, bool, error) {
		return nil, false, nil
	}))
	for _, j := range []jobs.Job{
		{Name: "short-at-most", Every: every, AtMostFor: every / 2, Run: run},
		{Name: "at-least-a-period", Every: every, AtMostFor: 2 * every, AtLeastFor: every + every/2, Run: run},
		{Name: "at-least-all-of-it", Every: every, AtLeastFor: every, Run: run},
	} {
		if err := s.Add(j); err == nil {
			t.Errorf("Add accepted %s (at most %v, at least %v, every %v)", j.Name, j.AtMostFor, j.AtLeastFor, j.Every)
		}
	}
	if err := s.Add(jobs.Job{Name: "defaults", Every: every, Run: run}); err != nil {
		t.Errorf("Add refused the defaults: %v", err)
	}
}

// fakeAudit audits from a table; a SKU in block waits for the run's end.
type fakeAudit struct {
	audits map[string]inventory.Audit
	block  map[string]bool
	cancel context.CancelFunc
}

func (f fakeAudit) SKUsAfter(_ context.Context, after string, limit int) ([]string, error) {
	var page []string
	for _, sku := range []string{"a", "b", "c"} {
		if sku > after && len(page) < limit {
			page = append(page, sku)
		}
	}
	return page, nil
}

func (f fakeAudit) Audit(ctx context.Context, sku string) (inventory.Audit, error) {
	if f.block[sku] {
		f.cancel() // the run reaches its "at most for"
		<-ctx.Done()
		return inventory.Audit{}, ctx.Err()
	}
	return f.audits[sku], nil
}

type auditObs struct {
	mu    sync.Mutex
	calls [][2]int
}

func (o *auditObs) Audited(audited, inconsistent int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = append(o.calls, [2]int{audited, inconsistent})
}

// A run stopped by its context (at "at most for", or shutdown) after
// finding an inconsistent SKU still tells the observer what it found, so
// that stock_audit_inconsistent_skus rises even for an audit that always
// outlasts its period (rather than keeping the previous run's 0).
//
// Interleaving: SKU a is inconsistent and audited; the audit of b ends
// with the run's context; the job returns its context's error, and
// Audited has been called with a inconsistent.
func TestStoppedAuditStillReportsInconsistentSKUs(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	f := fakeAudit{
		audits: map[string]inventory.Audit{"a": {SKU: "a", Initial: 10, Available: 5, Ordered: 7}},
		block:  map[string]bool{"b": true},
		cancel: cancel,
	}
	var obs auditObs
	j := jobs.AuditJob(time.Minute, f, f, quiet(), &obs)
	err := j.Run(ctx)
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("want the run to fail with its context's end, got %v", err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.calls) == 0 || obs.calls[0][1] < 1 {
		t.Fatalf("SKU a was found inconsistent, but the observer heard %v", obs.calls)
	}
}
