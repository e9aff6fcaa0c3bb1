package main

import (
	"os"
	"strings"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
)

// TestReadmeNamesEveryStrategy: the README's table of strategies has a row
// for every registered strategy, with its class, and the README stays the
// front door: at most 300 lines.
func TestReadmeNamesEveryStrategy(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	if n := strings.Count(readme, "\n"); n > 300 {
		t.Errorf("README.md has %d lines; the front door has at most 300 (the rest belongs in docs/)", n)
	}
	for _, s := range inventory.Strategies() {
		var row string
		for line := range strings.Lines(readme) {
			if strings.HasPrefix(line, "| `"+s.Name+"`") {
				row = line
				break
			}
		}
		switch {
		case row == "":
			t.Errorf("README.md's table has no row for %s", s.Name)
		case s.Safe() && !strings.Contains(row, "| safe |"):
			t.Errorf("README.md's row for %s does not say safe: %s", s.Name, row)
		case !s.Safe() && !strings.Contains(row, "control"):
			t.Errorf("README.md's row for %s does not say it is a control: %s", s.Name, row)
		}
	}
}

// TestReadmeQuotesThePublishedRun: every figure in the README's section
// on the latest run is quoted, line for line, from the published report it
// links to (docs/results/<run>/report.md, written by the demo), not
// retyped.
func TestReadmeQuotesThePublishedRun(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	begin := strings.Index(readme, "## What it costs")
	end := strings.Index(readme, "## Configuration")
	if begin < 0 || end < begin {
		t.Fatal("README.md has no section \"## What it costs\" before \"## Configuration\"")
	}
	section := readme[begin:end]
	const prefix = "](docs/results/"
	i := strings.Index(section, prefix)
	if i < 0 {
		t.Fatal("the section links to no report under docs/results/")
	}
	link, _, _ := strings.Cut(section[i+2:], ")")
	report, err := os.ReadFile("../../" + link)
	if err != nil {
		t.Fatalf("the linked report: %v", err)
	}
	quoted := 0
	for line := range strings.Lines(section) {
		line = strings.TrimSpace(line)
		line = strings.TrimSpace(strings.TrimPrefix(line, ">"))
		if !strings.HasPrefix(line, "- ") && !strings.HasPrefix(line, "**") && !strings.Contains(line, " in ") {
			continue
		}
		if !strings.ContainsAny(line, "0123456789") {
			continue
		}
		quoted++
		if !strings.Contains(string(report), line) {
			t.Errorf("README.md says %q, which %s does not", line, link)
		}
	}
	if quoted < 5 {
		t.Errorf("only %d lines with figures found in the section: is it still the demo's summary?", quoted)
	}
}
