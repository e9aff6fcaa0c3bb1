package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/stock/lab/report"
)

func (d *demo) newRun(b backend, strategy, scenario string, round int) *report.Run {
	r := &report.Run{
		Backend: b.Name, Strategy: strategy, Scenario: scenario, Round: round,
		SKU:       fmt.Sprintf("demo-%s-%s-%s-%s-%d", d.runID, b.Name, strategy, scenario, round),
		Instances: d.p.Instances,
		Dir:       filepath.ToSlash(filepath.Join("runs", b.Name+"-"+strategy, fmt.Sprintf("round-%d", round), scenario)),
	}
	switch scenario {
	case report.Burst:
		r.Stock, r.VUs = d.burstStock(strategy), d.p.BurstVUs
		r.Buyers = int(math.Round(float64(r.Stock) * d.p.buyersPerUnit()))
	case report.Steady:
		r.Rate, r.Duration, r.VUs = d.steadyRates[b.Name], d.p.SteadyDuration, d.p.SteadyMaxVUs
		// Enough that the sale never sells out: steady measures the
		// rate of selling, the burst the end of the sale.
		r.Stock = int64(math.Ceil(float64(r.Rate)*d.p.SteadyDuration.Seconds()*1.2)) + 100
	}
	if len(r.SKU) > 64 {
		r.SKU = r.SKU[:64]
	}
	d.skus[b.Name] = append(d.skus[b.Name], r.SKU)
	return r
}

// runScenario runs k6 for r against the fleet, then audits and scrapes.
func (d *demo) runScenario(ctx context.Context, f *fleet, r *report.Run) {
	vars := [][2]string{
		{"BASE_URLS", strings.Join(f.urls(), ",")},
		{"ADMIN_TOKEN", d.p.AdminToken},
		{"SCENARIO", r.Scenario},
		{"SKU", r.SKU},
		{"STOCK", strconv.FormatInt(r.Stock, 10)},
		{"QUANTITY", "1"},
		{"STRATEGY", r.Strategy},
		{"BACKEND", r.Backend},
	}
	var planned time.Duration
	period := "1s"
	switch r.Scenario {
	case report.Burst:
		// A burst can be over in a second.
		period = "250ms"
		vars = append(vars,
			[2]string{"BUYERS", strconv.Itoa(r.Buyers)},
			[2]string{"VUS", strconv.Itoa(r.VUs)},
			[2]string{"MAX_DURATION", d.burstMaxDuration(r.Stock).String()})
	case report.Steady:
		vars = append(vars,
			[2]string{"RATE", strconv.Itoa(r.Rate)},
			[2]string{"DURATION", r.Duration.String()},
			[2]string{"MAX_VUS", strconv.Itoa(r.VUs)})
		planned = r.Duration
	}
	runDir := filepath.Join(d.dir, filepath.FromSlash(r.Dir))
	var backlog *backlogSampler
	if isReserved(r.Strategy) && r.Scenario == report.Burst {
		backlog = d.sampleBacklog(ctx, f, r.SKU)
	}
	res := d.k6.run(ctx, k6Job{
		Meter:           d.meter(f, d.backend(r.Backend), r.Strategy),
		Label:           fmt.Sprintf("%s · %s · %s", r.Backend, r.Strategy, r.Scenario),
		Script:          "flashsale.js",
		Vars:            vars,
		Dir:             runDir,
		Dashboard:       true,
		DashboardPeriod: period,
		Planned:         planned,
	})
	r.Command = instancesCommand(f) + "\n" + res.Command
	r.ExitCode, r.Summary, r.Wall = res.ExitCode, res.Summary, res.Wall
	r.Cost, r.SellCost = res.Cost, res.SellCost
	var errs []error
	if res.Err != nil {
		errs = append(errs, res.Err)
	}
	if _, err := os.Stat(filepath.Join(runDir, "dashboard.html")); err == nil {
		r.Dashboard = r.Dir + "/dashboard.html"
	}
	if err := f.dead(); err != nil {
		errs = append(errs, fmt.Errorf("an instance died during the run: %w", err))
	}
	audit, err := fetchAudit(ctx, f, d.p.AdminToken, r.SKU)
	if err != nil {
		errs = append(errs, err)
	} else {
		r.Audit = audit
	}
	if backlog != nil {
		r.Reserve = d.drain(ctx, f, r.SKU, backlog.stop())
	}
	r.Metrics = scrapeMetrics(ctx, f, runDir, r.Dir)
	if r.Reserve != nil {
		d.reserveLag(runDir, r)
	}
	// The histograms count from the instances' start: right after the
	// burst, the first run of fresh instances, they are the burst's.
	if r.Strategy == "batched" && r.Scenario == report.Burst {
		b, err := batchesOf(runDir, r.Metrics, r.Dir)
		if err != nil {
			errs = append(errs, err)
		}
		r.Batches = b
		if b != nil {
			d.progress.note("batches: %d, %.1f orders per batch on average (p99 ≤ %.0f), transaction %s on average",
				b.Count, b.Mean, b.P99Bound, b.TxMean.Round(10*time.Microsecond))
		}
	}
	if err := errors.Join(errs...); err != nil {
		r.Error = err.Error()
	}
	if r.Audit != nil {
		v := r.Judge()
		d.progress.note("audit: initial %d, available %d, ordered %d in %d orders → %s %s",
			r.Audit.Initial, r.Audit.Available, r.Audit.Ordered, r.Audit.Orders, report.StatusText(v), strings.Join(v.Problems, "; "))
	}
}

// backend is the plan's backend of that name.
func (d *demo) backend(name string) backend {
	for _, b := range d.p.Backends {
		if b.Name == name {
			return b
		}
	}
	return backend{Name: name}
}

func roundSuffix(rounds, round int) string {
	if rounds <= 1 {
		return ""
	}
	return fmt.Sprintf(" #%d", round)
}

// instancesCommand is how to start the fleet by hand, for the report.
func instancesCommand(f *fleet) string {
	var lines []string
	for _, in := range f.instances {
		lines = append(lines, shellJoin(append(append([]string{}, f.env...), "HTTP_ADDR="+strings.TrimPrefix(in.url, "http://")))+" bin/stock &")
	}
	return strings.Join(lines, "\n")
}

// fetchAudit reads GET /admin/audit/{sku} from the first instance that
// answers.
func fetchAudit(ctx context.Context, f *fleet, token, sku string) (*report.Audit, error) {
	client := &http.Client{Timeout: 10 * time.Second}
	var errs []error
	for _, in := range f.instances {
		if !in.running() {
			continue
		}
		req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodGet, in.url+"/admin/audit/"+sku, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			errs = append(errs, fmt.Errorf("audit from %s: %s %s %v", in.url, resp.Status, body, err))
			continue
		}
		var a report.Audit
		if err := json.Unmarshal(body, &a); err != nil {
			return nil, fmt.Errorf("audit from %s: %w", in.url, err)
		}
		return &a, nil
	}
	return nil, fmt.Errorf("no instance answered the audit: %w", errors.Join(errs...))
}

// scrapeMetrics keeps each instance's /metrics text when it answers 200;
// the service may not have the route, and nothing depends on it.
func scrapeMetrics(ctx context.Context, f *fleet, dir, rel string) []string {
	client := &http.Client{Timeout: 5 * time.Second}
	var files []string
	for i, in := range f.instances {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, in.url+"/metrics", nil)
		if err != nil {
			continue
		}
		resp, err := client.Do(req)
		if err != nil {
			continue
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			continue
		}
		name := fmt.Sprintf("metrics-i%d.txt", i+1)
		if os.WriteFile(filepath.Join(dir, name), body, 0o644) == nil {
			files = append(files, rel+"/"+name)
		}
	}
	return files
}
