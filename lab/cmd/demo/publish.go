package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/flashsale/stock/lab/report"
)

// A published copy (PUBLISH=1, docs/results/<stamp>/) holds the report's
// data and pages, not its runs' folders (k6 dashboards, summaries, logs:
// tens of megabytes, and no tracked file may pass 1 MB). Its pages are
// rendered there, from the data, so that they link only what the copy
// holds.

// render writes a report's pages again from its results.json.gz, with the
// fault suite's run found beside it.
func render(dir string) error {
	rep, err := loadForPages(dir)
	if err != nil {
		return err
	}
	return report.WritePages(dir, rep)
}

// publish copies a report's data to dest and renders its pages there.
func publish(src, dest string) error {
	data, err := os.ReadFile(filepath.Join(src, "results.json.gz"))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dest, "results.json.gz"), data, 0o644); err != nil {
		return err
	}
	// The runs' summaries are in src only: their figures go into the
	// published data (Save keeps them).
	rep, err := report.Load(src)
	if err != nil {
		return err
	}
	if err := rep.Save(dest); err != nil {
		return err
	}
	return render(dest)
}

// choose writes choosing.md for docs/ from a published run: its links
// lead to that run's page.
func choose(out io.Writer, dir string) error {
	rep, err := loadForPages(dir)
	if err != nil {
		return err
	}
	page := filepath.ToSlash(filepath.Join("results", filepath.Base(filepath.Clean(dir)), "index.html"))
	return report.WriteChoosing(out, rep, page, "go run ./lab/cmd/demo choose "+filepath.ToSlash(filepath.Clean(dir))+" > docs/choosing.md")
}

// loadForPages loads a report and the fault suite's run beside it.
func loadForPages(dir string) (*report.Report, error) {
	rep, err := report.Load(dir)
	if err != nil {
		return nil, err
	}
	faults, err := findFaults(dir, rep.Faults == nil)
	if err != nil {
		return nil, err
	}
	if faults != nil {
		rep.Faults = faults
	}
	return rep, nil
}

// findFaults finds the fault suite's latest run beside a report's folder:
// reports/faults/latest for reports/<stamp>; with orPublished, for a report
// that carries no fault results of its own, the newest published
// docs/results/faults-<stamp>/ beside docs/results/<stamp> from before the
// report's run (faults.json, or the faults.md a published run keeps). nil,
// nil when there is none.
func findFaults(dir string, orPublished bool) (*report.Faults, error) {
	parent := filepath.Dir(filepath.Clean(dir))
	f, err := report.LoadFaults(filepath.Join(parent, "faults", "latest"), dir)
	if f != nil || err != nil || !orPublished {
		return f, err
	}
	entries, err := os.ReadDir(parent)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var published []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "faults-") {
			published = append(published, e.Name())
		}
	}
	// faults-<stamp>: the newest sorts last. A report in a folder named
	// by its stamp takes the newest run published before it began.
	slices.Sort(published)
	stamp := filepath.Base(filepath.Clean(dir))
	for _, name := range slices.Backward(published) {
		if isStamp(stamp) && strings.TrimPrefix(name, "faults-") > stamp {
			continue
		}
		run := filepath.Join(parent, name)
		if f, err := report.LoadFaults(run, dir); f != nil || err != nil {
			return f, err
		}
		md := filepath.Join(run, "faults.md")
		if _, err := os.Stat(md); err == nil {
			f, err := report.LoadFaultsMarkdown(md, dir)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", md, err)
			}
			return f, nil
		}
	}
	return nil, nil
}

// isStamp reports whether a folder's name begins with a run's timestamp,
// 20261128-232612.
func isStamp(name string) bool {
	_, err := time.Parse("20060102-150405", name[:min(len(name), len("20060102-150405"))])
	return err == nil
}
