package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
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
	// The suite's verdict line repeats the verdict and the name, which
	// have columns of their own here: keep the figures.
	for i, r := range f.Runs {
		if at := strings.Index(r.Line, r.Name); at >= 0 {
			f.Runs[i].Line = strings.TrimSpace(r.Line[at+len(r.Name):])
		}
	}
	// Resolve reports/faults/latest to its timestamped folder, so the link
	// keeps pointing at the run this report describes.
	target := faultsDir
	if resolved, err := filepath.EvalSymlinks(faultsDir); err == nil {
		target = resolved
	}
	absReport, err1 := filepath.Abs(reportDir)
	absTarget, err2 := filepath.Abs(filepath.Join(target, "faults.md"))
	if err1 == nil && err2 == nil {
		if rel, err := filepath.Rel(absReport, absTarget); err == nil {
			f.Link = filepath.ToSlash(rel)
		}
	}
	return &f, nil
}
