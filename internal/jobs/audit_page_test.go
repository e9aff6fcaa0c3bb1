package jobs_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/jobs"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// countingAuditor audits through the database and counts the audits of
// each SKU.
type countingAuditor struct {
	db     store.Store
	mu     sync.Mutex
	counts map[string]int
}

func (a *countingAuditor) Audit(ctx context.Context, sku string) (inventory.Audit, error) {
	a.mu.Lock()
	a.counts[sku]++
	a.mu.Unlock()
	return a.db.Audit(ctx, sku)
}

type observed struct{ audited []int }

func (o *observed) Audited(audited, _ int) { o.audited = append(o.audited, audited) }

// TestAuditJobAuditsAPagePerRun: with more SKUs on sale than a page, a run
// of the audit job audits one page, the next runs go on from there, and
// after the last page the walk starts over: every SKU is audited once per
// walk, and no run's cost grows with the catalog.
func TestAuditJobAuditsAPagePerRun(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			db := testdb.New(t, engine, 8)
			ctx := context.Background()
			const skus = jobs.AuditPage*2 + 37
			var wg sync.WaitGroup
			work := make(chan int)
			errs := make(chan error, skus)
			for range 8 {
				wg.Go(func() {
					for i := range work {
						if err := db.StartSale(ctx, fmt.Sprintf("page-%05d", i), 3); err != nil {
							errs <- err
						}
					}
				})
			}
			for i := range skus {
				work <- i
			}
			close(work)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			auditor := &countingAuditor{db: db, counts: map[string]int{}}
			obs := &observed{}
			job := jobs.AuditJob(time.Minute, db, auditor, quiet(), obs)
			for range 4 {
				if err := job.Run(ctx); err != nil {
					t.Fatal(err)
				}
			}
			want := []int{jobs.AuditPage, jobs.AuditPage, 37, jobs.AuditPage}
			if fmt.Sprint(obs.audited) != fmt.Sprint(want) {
				t.Fatalf("runs audited %v SKUs, want %v", obs.audited, want)
			}
			if len(auditor.counts) != skus {
				t.Fatalf("%d distinct SKUs audited in four runs, want all %d", len(auditor.counts), skus)
			}
			twice := 0
			for _, n := range auditor.counts {
				if n == 2 {
					twice++
				}
			}
			if twice != jobs.AuditPage {
				t.Fatalf("%d SKUs audited twice, want the first page's %d (the walk started over)", twice, jobs.AuditPage)
			}
		})
	}
}
