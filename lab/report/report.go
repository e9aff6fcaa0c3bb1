// Package report turns the results of a demo run (k6 summaries, the
// service's audits, the measured ceilings) into verdicts and ratios, and
// renders them as a self-contained HTML page and a Markdown file.
//
// It does no I/O beyond reading the files it is pointed at and writing the
// ones it is asked to: the runner (lab/cmd/demo) measures, this package judges
// and presents, so the judgement can be unit-tested on fixed summaries.
package report

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Scenarios, as loadtest/lib/profiles.js names them.
const (
	Burst  = "burst"
	Steady = "steady"
)

// Report is everything one demo run found.
type Report struct {
	Title    string    `json:"title"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Mode is "default" or "quick" (DEMO_QUICK=1).
	Mode     string      `json:"mode"`
	Env      Environment `json:"environment"`
	Settings []Setting   `json:"settings"`
	// Commands rerun the whole comparison.
	Commands []string `json:"commands"`
	// LoadGen is the load generator's ceiling, nil if it was not measured.
	LoadGen *LoadGen `json:"load_generator,omitempty"`
	// GoLoadGen is the second load generator's ceiling (lab/cmd/demo's Go
	// client against /healthz), GoBursts its bursts against the fastest
	// strategies.
	GoLoadGen *GoLoadGen `json:"go_load_generator,omitempty"`
	GoBursts  []GoBurst  `json:"go_bursts,omitempty"`
	// SoldOutRuns are the Go client's orders on each strategy's burst SKU
	// once sold out (SOLD_OUT_ORDERS); RatioBursts the ratio burst's
	// rounds (redis-reserve and conditional taking turns).
	SoldOutRuns []GoBurst `json:"sold_out_runs,omitempty"`
	RatioBursts []GoBurst `json:"ratio_bursts,omitempty"`
	// BuyersPerUnit is the one ratio of buyers to units of every burst.
	BuyersPerUnit float64   `json:"buyers_per_unit,omitempty"`
	Ceilings      []Ceiling `json:"ceilings"`
	Runs          []*Run    `json:"runs"`
	// CatalogRuns are the catalog scenario's runs (many SKUs, a few of
	// them hot), Catalogs in table order.
	CatalogRuns []*Catalog `json:"catalogs,omitempty"`
	// LifecycleRuns are the lifecycle scenario's runs (orders that come
	// back), Lifecycles in table order.
	LifecycleRuns []*Lifecycle `json:"lifecycles,omitempty"`
	// Notes are the runner's warnings, shown as they are.
	Notes []string `json:"notes,omitempty"`
	// Rounds is how often the burst ran per strategy and backend.
	Rounds int `json:"rounds,omitempty"`
	// Strategies and Backends fix the order of rows and charts.
	Strategies []string `json:"strategies"`
	Backends   []string `json:"backends"`
	// Faults is the latest fault-suite run, nil when make faults has not
	// run on this machine.
	Faults *Faults `json:"faults,omitempty"`
	// Failover is the failover section (FAILOVER=1), nil when it did not
	// run.
	Failover *Failover `json:"failover,omitempty"`
	// Capacity is what the capacity estimate assumes (CAPACITY_SERVICE_CORES,
	// CAPACITY_DATABASE_CORES); nil leaves the estimate out.
	Capacity *Capacity `json:"capacity,omitempty"`
}

// Environment describes the machine and the software, so that a reader can
// tell whether their own numbers are comparable.
type Environment struct {
	Host      string `json:"host"`
	CPU       string `json:"cpu"`
	Cores     int    `json:"cores"`
	Memory    string `json:"memory"`
	OS        string `json:"os"`
	Go        string `json:"go"`
	K6        string `json:"k6"`
	Postgres  string `json:"postgres,omitempty"`
	MySQL     string `json:"mysql,omitempty"`
	Redis     string `json:"redis,omitempty"`
	Etcd      string `json:"etcd,omitempty"`      // etcd-lock's, when it ran
	ZooKeeper string `json:"zookeeper,omitempty"` // zk-lock's, when it ran
	GitCommit string `json:"git_commit"`
	// LoadAtStart and LoadAtEnd are /proc/loadavg when the run began and
	// ended: a load above the core count means something else was
	// running, and the figures are noisier than usual.
	LoadAtStart string `json:"load_at_start,omitempty"`
	LoadAtEnd   string `json:"load_at_end,omitempty"`
	// DBSettings are the database settings that decide hot-row speed
	// (synchronous_commit, innodb_flush_log_at_trx_commit, …).
	DBSettings []Setting `json:"db_settings,omitempty"`
}

// Setting is one knob of the run and why it has its value.
type Setting struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	Note  string `json:"note,omitempty"`
}

// LoadGen is k6 against GET /healthz on the same instances: the most
// requests per second this machine pushes through HTTP at all.
type LoadGen struct {
	RequestsPerSec float64       `json:"requests_per_sec"`
	Requests       int64         `json:"requests"`
	VUs            int           `json:"vus"`
	Duration       time.Duration `json:"duration_ns"`
	P99            time.Duration `json:"p99_ns"`
	Command        string        `json:"command"`
	Dir            string        `json:"dir"`
	Dashboard      string        `json:"dashboard,omitempty"`
	Error          string        `json:"error,omitempty"`
	// Cost is the CPU the run took, by process class.
	Cost *CPUCost `json:"cost,omitempty"`
}

// Ceiling is the hot-row ceiling of one statement on one backend, measured
// without the service (lab/hotrow).
type Ceiling struct {
	Backend   string        `json:"backend"`
	Statement string        `json:"statement"`
	SQL       string        `json:"sql"`
	Workers   int           `json:"workers"`
	Duration  time.Duration `json:"duration_ns"`
	Committed int64         `json:"committed"`
	Failed    int64         `json:"failed"`
	PerSecond float64       `json:"per_second"`
	P50       time.Duration `json:"p50_ns"`
	P99       time.Duration `json:"p99_ns"`
	Error     string        `json:"error,omitempty"`
	// Round numbers the measurements of one statement: the runner
	// measures the ceilings again before each round of bursts.
	Round int `json:"round,omitempty"`
	// RoundsPerSec is every round's figure, set on the medians that
	// MedianCeilings returns.
	RoundsPerSec []float64 `json:"-"`
}

// MedianCeilings returns one ceiling per backend, statement and connection
// count: the round with the median rate (of an even count, the lower),
// carrying every round's rate in RoundsPerSec. Failed measurements count
// only when no round succeeded.
func (r *Report) MedianCeilings() []Ceiling {
	type key struct {
		backend, statement string
		workers            int
	}
	groups := map[key][]Ceiling{}
	var keys []key
	for _, c := range r.Ceilings {
		k := key{c.Backend, c.Statement, c.Workers}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], c)
	}
	var out []Ceiling
	for _, k := range keys {
		var ok []Ceiling
		for _, c := range groups[k] {
			if c.Error == "" && c.PerSecond > 0 {
				ok = append(ok, c)
			}
		}
		if len(ok) == 0 {
			out = append(out, groups[k][0])
			continue
		}
		rounds := slices.Clone(ok)
		slices.SortStableFunc(rounds, func(a, b Ceiling) int { return cmp.Compare(a.Round, b.Round) })
		slices.SortStableFunc(ok, func(a, b Ceiling) int { return cmp.Compare(a.PerSecond, b.PerSecond) })
		m := ok[(len(ok)-1)/2]
		m.RoundsPerSec = nil
		for _, c := range rounds {
			m.RoundsPerSec = append(m.RoundsPerSec, c.PerSecond)
		}
		out = append(out, m)
	}
	return out
}

// Failures lists why the demo must exit non-zero: a safe strategy that
// oversold or lost an order, a run that did not complete, a ceiling that
// could not be measured. An oversold control is not a failure.
func (r *Report) Failures() []string {
	var out []string
	for _, sc := range []string{Burst, Steady} {
		for _, row := range r.Rows(sc) {
			for _, run := range row.Rounds {
				v := run.Judge()
				if v.Status != StatusFail && v.Status != StatusError {
					continue
				}
				name := fmt.Sprintf("%s/%s %s", run.Backend, run.Strategy, sc)
				if len(row.Rounds) > 1 {
					name += fmt.Sprintf(" round %d", run.Round)
				}
				for _, p := range v.Problems {
					out = append(out, name+": "+p)
				}
			}
		}
	}
	for _, c := range r.Ceilings {
		if c.Error != "" {
			name := fmt.Sprintf("hot-row ceiling %s/%s from %d connections", c.Backend, c.Statement, c.Workers)
			if c.Round > 0 {
				name += fmt.Sprintf(" round %d", c.Round)
			}
			out = append(out, name+": "+c.Error)
		}
	}
	if r.LoadGen != nil && r.LoadGen.Error != "" {
		out = append(out, "load generator ceiling: "+r.LoadGen.Error)
	}
	if r.GoLoadGen != nil && r.GoLoadGen.Error != "" {
		out = append(out, "Go load generator ceiling: "+r.GoLoadGen.Error)
	}
	for _, g := range r.GoBursts {
		for _, p := range g.Problems() {
			out = append(out, fmt.Sprintf("%s/%s burst from the Go client round %d: %s", g.Backend, g.Strategy, g.Round, p))
		}
	}
	for _, set := range []struct {
		name string
		runs []GoBurst
	}{{"sold-out run", r.SoldOutRuns}, {"ratio burst", r.RatioBursts}} {
		for _, g := range set.runs {
			if IsControl(g.Strategy) {
				continue // a control may oversell: its burst's row says so
			}
			for _, p := range g.Problems() {
				out = append(out, fmt.Sprintf("%s/%s %s round %d: %s", g.Backend, g.Strategy, set.name, g.Round, p))
			}
		}
	}
	for _, c := range r.Catalogs() {
		if v := c.Judge(); v.Status == StatusFail || v.Status == StatusError {
			for _, p := range v.Problems {
				out = append(out, fmt.Sprintf("%s/%s catalog: %s", c.Backend, c.Label(), p))
			}
		}
	}
	for _, l := range r.Lifecycles() {
		if v := l.Judge(); v.Status == StatusFail || v.Status == StatusError {
			for _, p := range v.Problems {
				out = append(out, fmt.Sprintf("%s/%s lifecycle: %s", l.Backend, l.Strategy, p))
			}
		}
	}
	return append(out, r.failoverFailures()...)
}

// resultsFile is where Save writes the report's data, beside the pages,
// gzipped; oldResultsFile is the plain JSON of reports saved before.
const (
	resultsFile    = "results.json.gz"
	oldResultsFile = "results.json"
)

// Save writes the report's data as results.json.gz in dir; Load reads it
// back with the k6 summaries, so a report can be rendered again. Gzipped:
// a full run's JSON, even compact, is over the 1 MB a tracked file may
// have (make tracked: 1.06 MB for every strategy on both engines with the
// lifecycle and the cost goals), and PUBLISH=1 commits it; `zcat
// results.json.gz | jq .` shows it.
func (r *Report) Save(dir string) error {
	// The k6 summaries stay in the runs' folders, which are not
	// published: keep what the report reads of them.
	for _, run := range r.Runs {
		if run.Summary != nil {
			run.K6 = run.figures()
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, resultsFile), buf.Bytes(), 0o644)
}

// readResults reads dir's results.json.gz, or the plain results.json of a
// report saved before it.
func readResults(dir string) ([]byte, string, error) {
	f, err := os.Open(filepath.Join(dir, resultsFile))
	if errors.Is(err, fs.ErrNotExist) {
		b, err := os.ReadFile(filepath.Join(dir, oldResultsFile))
		return b, oldResultsFile, err
	}
	if err != nil {
		return nil, resultsFile, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, resultsFile, err
	}
	b, err := io.ReadAll(zr)
	return b, resultsFile, err
}

// Load reads dir/results.json.gz (or results.json) and every run's
// summary.json.
func Load(dir string) (*Report, error) {
	b, name, err := readResults(dir)
	if err != nil {
		return nil, fmt.Errorf("report: %s: %w", name, err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("report: %s: %w", name, err)
	}
	for _, run := range r.Runs {
		if run.Dir == "" {
			continue
		}
		s, err := ReadSummary(filepath.Join(dir, run.Dir, "summary.json"))
		switch {
		case err == nil:
			run.Summary = s
		case !errors.Is(err, fs.ErrNotExist):
			return nil, err
		}
	}
	return &r, nil
}

// round rounds to n significant digits, for figures in prose.
func round(v float64, n int) float64 {
	if v == 0 {
		return 0
	}
	p := math.Pow(10, float64(n)-math.Ceil(math.Log10(math.Abs(v))))
	return math.Round(v*p) / p
}
