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
