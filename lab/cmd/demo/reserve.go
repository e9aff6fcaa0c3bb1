package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/flashsale/stock/lab/report"
)

// backlogSampler polls a SKU's audit during a burst of redis-reserve or
// redis-watch and keeps the most orders it saw pending (accepted, not yet
// in the database).
type backlogSampler struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	peak   int64
}

// sampleBacklog starts a sampler of sku's pending orders every 100ms.
func (d *demo) sampleBacklog(ctx context.Context, f *fleet, sku string) *backlogSampler {
	ctx, cancel := context.WithCancel(ctx)
	b := &backlogSampler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(b.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if a, err := fetchAudit(ctx, f, d.p.AdminToken, sku); err == nil {
				b.mu.Lock()
				b.peak = max(b.peak, a.Pending)
				b.mu.Unlock()
			}
		}
	}()
	return b
}

// stop ends the sampler and returns the peak it saw.
func (b *backlogSampler) stop() int64 {
	b.cancel()
	<-b.done
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.peak
}

// drain waits (at most a minute) until the burst's orders are all in the
// database, and reports how long that took after the burst.
func (d *demo) drain(ctx context.Context, f *fleet, sku string, peak int64) *report.Reservations {
	res := &report.Reservations{PeakBacklog: peak}
	began := time.Now()
	deadline := began.Add(time.Minute)
	for {
		a, err := fetchAudit(ctx, f, d.p.AdminToken, sku)
		if err == nil {
			res.PeakBacklog = max(res.PeakBacklog, a.Pending)
			if a.Pending == 0 {
				res.Drain = time.Since(began)
				return res
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			res.Error = "orders still pending a minute after the burst"
			return res
		}
		// Other processes' consumers write the orders: the audit is the
		// signal, so poll it.
		time.Sleep(20 * time.Millisecond)
	}
}

// reserveLag reads the time from 201 to order row from the metrics scraped
// after the drain.
func (d *demo) reserveLag(runDir string, r *report.Run) {
	var readers []io.Reader
	for _, name := range r.Metrics {
		f, err := os.Open(filepath.Join(runDir, strings.TrimPrefix(name, r.Dir+"/")))
		if err != nil {
			r.Reserve.Error = err.Error()
			return
		}
		defer f.Close()
		readers = append(readers, f)
	}
	written, p50, p99, err := report.ParseReserveLag(readers...)
	if err != nil {
		r.Reserve.Error = err.Error()
		return
	}
	r.Reserve.Written, r.Reserve.LagP50Bound, r.Reserve.LagP99Bound = written, p50, p99
	d.progress.note("to the database: %d orders written, peak backlog %d, drained %s after the burst, 201 → row p50 ≤ %s, p99 ≤ %s",
		written, r.Reserve.PeakBacklog, r.Reserve.Drain.Round(time.Millisecond), p50, p99)
}
