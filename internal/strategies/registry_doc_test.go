package strategies_test

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/flashsale/stock/internal/strategies"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the registry's table in docs/strategies.md")

const (
	docPath    = "../../docs/strategies.md"
	tableBegin = "<!-- registry: begin (go test ./internal/strategies -run TestStrategiesDocMatchesTheRegistry -update-docs) -->"
	tableEnd   = "<!-- registry: end -->"
)

// registryTable is the registry as docs/strategies.md shows it.
func registryTable() string {
	var b strings.Builder
	b.WriteString("| `STRATEGY` | class | family | needs besides the database | what makes the write safe | the schedule that oversells without it |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, s := range strategies.All() {
		needs := "nothing"
		if len(s.Needs) > 0 {
			var n []string
			for _, srv := range s.Needs {
				n = append(n, string(srv))
			}
			needs = strings.Join(n, ", ")
		}
		class := string(s.Class)
		if !s.Safe() {
			class = "**" + class + "**"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", s.Name, class, s.Family, needs, s.Invariant, s.Breaks)
	}
	return b.String()
}

// TestStrategiesDocMatchesTheRegistry: the table at the top of
// docs/strategies.md is the registry's, not retyped; -update-docs writes it.
func TestStrategiesDocMatchesTheRegistry(t *testing.T) {
	b, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	begin, end := strings.Index(doc, tableBegin), strings.Index(doc, tableEnd)
	if begin < 0 || end < begin {
		t.Fatalf("%s has no %q … %q section", docPath, tableBegin, tableEnd)
	}
	want := doc[:begin] + tableBegin + "\n" + registryTable() + doc[end:]
	if want == doc {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(docPath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's table differs from the registry: run go test ./internal/strategies -run TestStrategiesDocMatchesTheRegistry -update-docs", docPath)
}
