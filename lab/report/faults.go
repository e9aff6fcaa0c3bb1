package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/stock/lab/faults"
)

// Faults is the latest fault-suite run (make faults), so that the
// comparison says what each strategy survives beside what it costs: the
// suite's own faults.json, read as it is; the full account stays in
// faults.md.
type Faults = faults.Report

// FaultRun is one scenario run of the suite.
type FaultRun = faults.Result

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
			f.Verdict, f.Short = faults.Verdict(m[1]), m[2] == "short"
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
		f.Runs = append(f.Runs, FaultRun{Scenario: n, Name: m[2], Verdict: faults.Verdict(m[3]), Line: figuresLine(header, m[4])})
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
