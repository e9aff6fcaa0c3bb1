package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/strategies"
)

// Faults summarises the latest fault-suite run (make faults), so that the
// comparison says what each strategy survives beside what it costs. It is
// read from the suite's faults.json; the full account stays in faults.md.
type Faults struct {
	// Link is faults.md relative to the report's folder.
	Link     string     `json:"link"`
	Started  time.Time  `json:"started"`
	Short    bool       `json:"short"`
	Verdict  string     `json:"verdict"`
	Runs     []FaultRun `json:"runs"`
	Finished time.Time  `json:"finished"`
}

// FaultRun is one scenario run: its name, verdict and verdict line.
type FaultRun struct {
	Scenario int    `json:"scenario"`
	Name     string `json:"name"`
	Title    string `json:"title"`
	Verdict  string `json:"verdict"`
	Line     string `json:"line"`
	// Strategy is the configuration's STRATEGY, Unsafe whether it was
	// one expected to oversell under the fault (FENCING=off). Read from
	// faults.json's config; for a suite read from faults.md, or saved
	// before these fields, FaultStrategy and FaultUnsafe tell them from
	// the run's name.
	Strategy string `json:"strategy,omitempty"`
	Unsafe   bool   `json:"unsafe,omitempty"`
}

// FaultStrategy is the strategy a fault run put under its fault: its
// configuration's, else the segment of its name that names a strategy
// ("2-paused-holder/redlock/fencing-on"), else the one its scenario exists
// for ("7-etcd-leader-kill").
func (f FaultRun) FaultStrategy() string {
	if f.Strategy != "" {
		return f.Strategy
	}
	for _, seg := range strings.Split(f.Name, "/") {
		if _, ok := strategies.Lookup(seg); ok {
			return seg
		}
	}
	scenario, _, _ := strings.Cut(f.Name, "/")
	switch {
	case strings.HasPrefix(scenario, "3-redlock-"):
		return strategies.NameRedlock
	case strings.HasPrefix(scenario, "7-etcd-"):
		return strategies.NameEtcdLock
	case strings.HasPrefix(scenario, "7-zk-"):
		return strategies.NameZKLock
	}
	return ""
}

// FaultUnsafe reports whether the run's configuration was one expected to
// oversell (FENCING=off), from its name when faults.json did not say.
func (f FaultRun) FaultUnsafe() bool {
	return f.Unsafe || slices.Contains(strings.Split(f.Name, "/"), "fencing-off")
}

// Duration is how long the suite ran, 0 when unknown.
func (f *Faults) Duration() time.Duration {
	if f.Finished.IsZero() || f.Started.IsZero() || f.Finished.Before(f.Started) {
		return 0
	}
	return f.Finished.Sub(f.Started)
}

// LoadFaults reads faultsDir/faults.json (the suite's latest run) and makes
// its link relative to reportDir. It returns nil, nil when the suite has
// not run.
func LoadFaults(faultsDir, reportDir string) (*Faults, error) {
	raw, err := os.ReadFile(filepath.Join(faultsDir, "faults.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f Faults
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("report: %s: %w", filepath.Join(faultsDir, "faults.json"), err)
	}
	// The configuration of each run: which strategy, and whether it was
	// expected to hold.
	var configs struct {
		Runs []struct {
			Config struct {
				Strategy string `json:"strategy"`
				Safe     *bool  `json:"safe"`
			} `json:"config"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(raw, &configs); err == nil && len(configs.Runs) == len(f.Runs) {
		for i, c := range configs.Runs {
			f.Runs[i].Strategy = c.Config.Strategy
			f.Runs[i].Unsafe = c.Config.Safe != nil && !*c.Config.Safe
		}
	}
	// The suite's verdict line repeats the verdict and the name, which
	// have columns of their own here: keep the figures.
	for i, r := range f.Runs {
		if at := strings.Index(r.Line, r.Name); at >= 0 {
			f.Runs[i].Line = strings.TrimSpace(r.Line[at+len(r.Name):])
		}
	}
	f.Link = relativeLink(filepath.Join(faultsDir, "faults.md"), reportDir)
	return &f, nil
}

// relativeLink is path relative to dir, through symlinks (so that
// reports/faults/latest keeps pointing at the run a report describes); ""
// when there is no such path.
func relativeLink(path, dir string) string {
	if resolved, err := filepath.EvalSymlinks(filepath.Dir(path)); err == nil {
		path = filepath.Join(resolved, filepath.Base(path))
	}
	absDir, err1 := filepath.Abs(dir)
	absPath, err2 := filepath.Abs(path)
	if err1 != nil || err2 != nil {
		return ""
	}
	rel, err := filepath.Rel(absDir, absPath)
	if err != nil {
		return ""
	}
	return filepath.ToSlash(rel)
}

// faultsMarkdownRow is a row of faults.md's table: | # | `name` |
// **verdict** | figures… |.
var faultsMarkdownRow = regexp.MustCompile("^\\| (\\d+) \\| `([^`]+)` \\| \\*\\*([a-z-]+)\\*\\* \\|(.*)\\|$")

// faultsMarkdownSuite is its line "Suite verdict: **ok** (full form, 50
// runs, started 2026-11-28 06:46:18 UTC, 1306s)."
var faultsMarkdownSuite = regexp.MustCompile(`^Suite verdict: \*\*([a-z-]+)\*\* \((short|full) form, \d+ runs, started (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC, (\d+)s\)`)

// LoadFaultsMarkdown reads a fault-suite run from its faults.md, for a run
// published without its faults.json (docs/results/faults-*/): the suite's
// verdict, start and duration, and each run's name, verdict and figures
// from the first table. Its link is relative to reportDir.
func LoadFaultsMarkdown(path, reportDir string) (*Faults, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f Faults
	header := ""
	for _, line := range strings.Split(string(raw), "\n") {
		if m := faultsMarkdownSuite.FindStringSubmatch(line); m != nil && f.Verdict == "" {
			f.Verdict, f.Short = m[1], m[2] == "short"
			if t, err := time.Parse("2006-01-02 15:04:05", m[3]); err == nil {
				f.Started = t.UTC()
				secs, _ := strconv.Atoi(m[4])
				f.Finished = f.Started.Add(time.Duration(secs) * time.Second)
			}
		}
		if strings.HasPrefix(line, "| # | run | verdict |") && header == "" {
			header = line
			continue
		}
		if header == "" {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break // the first table, with every run, has ended
		}
		m := faultsMarkdownRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		f.Runs = append(f.Runs, FaultRun{Scenario: n, Name: m[2], Verdict: m[3], Line: figuresLine(header, m[4])})
	}
	if f.Verdict == "" || len(f.Runs) == 0 {
		return nil, fmt.Errorf("report: %s: no suite verdict or no run table", path)
	}
	f.Link = relativeLink(path, reportDir)
	return &f, nil
}

// figuresLine writes a row's figures as the suite's verdict line does:
// requests=7940 orders=7940 ….
func figuresLine(header, cells string) string {
	names := strings.Split(strings.Trim(header, "| "), " | ")
	values := strings.Split(strings.Trim(cells, "| "), " | ")
	var parts []string
	for i, v := range values {
		if i+3 < len(names) {
			parts = append(parts, strings.ReplaceAll(names[i+3], " ", "_")+"="+strings.TrimSpace(v))
		}
	}
	return strings.Join(parts, " ")
}
