package main

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/stock/lab/report"
)

// recoverK6 gives the runs of a report saved before results.json.gz kept
// their k6 figures the figures its first report.md printed, so that the
// report renders again from its folder alone (a published copy has no
// runs/ folder, hence no summary.json). Only the median round of each
// strategy has every figure in that table; the other rounds get their
// orders/s, which the table lists in round order. Runs that already have
// figures are left as they are.
func recoverK6(dir, markdown string) error {
	rep, err := report.Load(dir)
	if err != nil {
		return err
	}
	f, err := os.Open(markdown)
	if err != nil {
		return err
	}
	defer f.Close()
	tables, err := readRunTables(f)
	if err != nil {
		return fmt.Errorf("%s: %w", markdown, err)
	}
	source := "read back from " + filepath.Base(markdown) + " as first published"
	filled := applyRunTables(rep, tables, source)
	if filled == 0 {
		return fmt.Errorf("%s: no run without figures matched a row of its tables", markdown)
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("The k6 figures of the burst and steady runs were not saved with this run's data; %d runs' figures were read back from the tables of its report.md as first published (lab/cmd/demo recover-k6): every figure of each strategy's median round, orders/s alone for its other rounds, whose verdicts rest on the audit alone.", filled))
	return rep.Save(dir)
}

// runTableRow is one row of the burst or steady table of a report.md.
type runTableRow struct {
	scenario, backendLabel, strategy string
	// perSec is the median round's orders/s, rounds every round's in
	// round order (just the one without rounds).
	perSec float64
	rounds []float64
	// available is the final available column: the median round's
	// audit, for a safe strategy, which tells tied rounds apart.
	available                         int64
	requestsPerSec                    float64
	p50, p95, p99, p99Sold, p99Out    time.Duration
	orders, soldOut, busy, errs, drop int64
}

// readRunTables reads the rows of the "## Burst: everyone clicks at once"
// and "## Steady: a constant arrival rate" tables.
func readRunTables(r io.Reader) ([]runTableRow, error) {
	var out []runTableRow
	scenario := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## Burst: everyone clicks at once"):
			scenario = report.Burst
			continue
		case strings.HasPrefix(line, "## Steady: a constant arrival rate"):
			scenario = report.Steady
			continue
		case strings.HasPrefix(line, "## "):
			scenario = ""
			continue
		}
		if scenario == "" || !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| backend ") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		row, err := parseRunRow(scenario, cells)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		out = append(out, row)
	}
	return out, sc.Err()
}

// parseRunRow reads the cells: backend, strategy, orders/s (rounds),
// requests/s, p50, p95, p99, p99 201 / sold out, orders, sold out, busy,
// errors, [offered, dropped,] and the audit's columns, which the audit in
// results.json.gz has itself.
func parseRunRow(scenario string, c []string) (runTableRow, error) {
	want := 17
	if scenario == report.Steady {
		want = 19
	}
	// Reports before the p99 of the 201s and of the sold-out answers had
	// a column less: give them an empty one.
	if len(c) == want-1 {
		c = slices.Insert(slices.Clone(c), 7, "–")
	}
	if len(c) != want {
		return runTableRow{}, fmt.Errorf("%d cells, want %d", len(c), want)
	}
	row := runTableRow{scenario: scenario, backendLabel: c[0], strategy: strings.Trim(c[1], "*")}
	var errs []error
	num := func(s string) float64 {
		v, err := parseFigure(s)
		if err != nil {
			errs = append(errs, err)
		}
		return v
	}
	dur := func(s string) time.Duration {
		d, err := parseLatency(s)
		if err != nil {
			errs = append(errs, err)
		}
		return d
	}
	rate, rounds, _ := strings.Cut(c[2], " (")
	row.perSec = num(rate)
	if rounds != "" {
		for _, v := range strings.Split(strings.TrimSuffix(rounds, ")"), " · ") {
			row.rounds = append(row.rounds, num(v))
		}
	} else {
		row.rounds = []float64{row.perSec}
	}
	row.requestsPerSec = num(c[3])
	row.p50, row.p95, row.p99 = dur(c[4]), dur(c[5]), dur(c[6])
	if sold, out, ok := strings.Cut(c[7], " / "); ok {
		row.p99Sold, row.p99Out = dur(sold), dur(out)
	}
	row.orders, row.soldOut, row.busy, row.errs = int64(num(c[8])), int64(num(c[9])), int64(num(c[10])), int64(num(c[11]))
	row.available = int64(num(c[12]))
	if scenario == report.Steady {
		row.drop = int64(num(c[13]))
		row.available = int64(num(c[14]))
	}
	if len(errs) > 0 {
		return runTableRow{}, errs[0]
	}
	return row, nil
}

// parseFigure reads 1,083, 45.3, −9 or "–" (none: 0).
func parseFigure(s string) (float64, error) {
	s = strings.TrimSuffix(strings.TrimSpace(s), "/s")
	if s == "–" || s == "" {
		return 0, nil
	}
	s = strings.ReplaceAll(strings.ReplaceAll(s, ",", ""), "−", "-")
	return strconv.ParseFloat(s, 64)
}

// parseLatency reads what fmtDur writes: 0.8 ms, 42 ms, 1.04 s, "–".
func parseLatency(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "–" || s == "" {
		return 0, nil
	}
	v, unit, ok := strings.Cut(s, " ")
	f, err := strconv.ParseFloat(v, 64)
	if !ok || err != nil {
		return 0, fmt.Errorf("latency %q", s)
	}
	switch unit {
	case "ms":
		return time.Duration(f * float64(time.Millisecond)), nil
	case "s":
		return time.Duration(f * float64(time.Second)), nil
	}
	return 0, fmt.Errorf("latency %q", s)
}

// applyRunTables fills the figures of the runs that have none from the
// table rows, and returns how many it filled. Its median round is the one
// rowOf picks: by orders/s, of an even count the lower.
func applyRunTables(rep *report.Report, rows []runTableRow, source string) int {
	filled := 0
	for _, row := range rows {
		var runs []*report.Run
		for _, run := range rep.Runs {
			if run.Scenario == row.scenario && run.Strategy == row.strategy && rep.BackendLabel(run.Backend) == row.backendLabel {
				runs = append(runs, run)
			}
		}
		slices.SortStableFunc(runs, func(a, b *report.Run) int { return cmp.Compare(a.Round, b.Round) })
		if len(runs) == 0 || len(runs) != len(row.rounds) {
			continue
		}
		order := make([]int, len(runs))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(row.rounds[a], row.rounds[b]) })
		median := order[(len(order)-1)/2]
		// Rounded to the table's precision, two rounds may tie: the one
		// whose audit is the row's is the median.
		for i, run := range runs {
			if row.rounds[i] == row.perSec && run.Audit != nil && run.Audit.Available == row.available {
				median = i
				break
			}
		}
		for i, run := range runs {
			if run.K6 != nil || run.Summary != nil {
				continue
			}
			k6 := &report.K6Figures{Source: source}
			k6.OrdersPerSec = row.rounds[i]
			if i != median {
				k6.OrdersPerSecOnly = true
			} else {
				st := &k6.Stats
				st.OrdersPerSec = row.perSec
				st.Orders, st.SoldOut, st.Busy, st.Errors, st.Dropped = row.orders, row.soldOut, row.busy, row.errs, row.drop
				st.Requests = st.Orders + st.SoldOut + st.Busy + st.Errors
				st.RequestsPerSec = row.requestsPerSec
				if st.OrdersPerSec > 0 {
					st.SellWindow = time.Duration(float64(st.Orders) / st.OrdersPerSec * float64(time.Second))
				}
				if st.RequestsPerSec > 0 {
					st.AnswerWindow = time.Duration(float64(st.Requests) / st.RequestsPerSec * float64(time.Second))
				}
				st.P50, st.P95, st.P99, st.HasLatency = row.p50, row.p95, row.p99, row.p99 > 0
				st.P99Created, st.P99SoldOut = row.p99Sold, row.p99Out
			}
			run.K6 = k6
			filled++
		}
	}
	return filled
}
