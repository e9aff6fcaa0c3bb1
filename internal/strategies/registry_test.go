package strategies_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strings"
	"testing"

	"github.com/flashsale/stock/internal/strategies"
)

// registeredConstants reads registry.go: the Name… constants it declares,
// and the constants its entries name (Name: …).
func registeredConstants(t *testing.T) (declared, entries []string) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "registry.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ValueSpec:
			for _, id := range n.Names {
				if strings.HasPrefix(id.Name, "Name") {
					declared = append(declared, id.Name)
				}
			}
		case *ast.KeyValueExpr:
			if key, ok := n.Key.(*ast.Ident); ok && key.Name == "Name" {
				if v, ok := n.Value.(*ast.Ident); ok {
					entries = append(entries, v.Name)
				}
			}
		}
		return true
	})
	return declared, entries
}

// TestRegistryDescribesEveryStrategy: every name the registry declares has
// one entry, with its class, family, invariant, breaking schedule and
// descriptions; a lock strategy says where its lock lives.
func TestRegistryDescribesEveryStrategy(t *testing.T) {
	declared, entries := registeredConstants(t)
	slices.Sort(declared)
	slices.Sort(entries)
	if !slices.Equal(declared, entries) {
		t.Errorf("registry.go declares %v and has entries for %v", declared, entries)
	}
	names := strategies.Names()
	if len(names) != len(slices.Compact(slices.Clone(names))) || len(names) != len(declared) {
		t.Errorf("registered %v: each name once, one per constant (%d)", names, len(declared))
	}
	for _, s := range strategies.All() {
		if s.Class != strategies.ClassSafe && s.Class != strategies.ClassControl {
			t.Errorf("%s: class %q", s.Name, s.Class)
		}
		if s.Family == "" || s.Invariant == "" || s.Breaks == "" || s.How == "" || s.Expect == "" {
			t.Errorf("%s: a field is empty: %+v", s.Name, s)
		}
		// One sentence: no full stop inside it.
		if strings.Contains(s.Invariant, ". ") || strings.HasSuffix(s.Invariant, ".") {
			t.Errorf("%s: the invariant is not one sentence without a full stop: %q", s.Name, s.Invariant)
		}
		if (s.Family == strategies.FamilyLock) != (s.Lock != "") {
			t.Errorf("%s: family %q, lock %q: a lock strategy, and only one, says where its lock lives", s.Name, s.Family, s.Lock)
		}
		if s.Build == nil {
			t.Errorf("%s: no Build", s.Name)
		}
	}
	for _, name := range strategies.ReservedNames {
		if e, _ := strategies.Lookup(name); !e.NeedsServer(strategies.ServerDurableRedis) {
			t.Errorf("%s counts stock in Redis but does not need a durable one", name)
		}
	}
	if !strategies.IsControl(strategies.NameNaive) || !strategies.IsControl(strategies.NameLegacyGetset) || strategies.IsControl(strategies.NameConditional) {
		t.Error("the controls are naive and legacy-getset, and conditional is not one")
	}
	if _, ok := strategies.Lookup("quorum-lock"); ok {
		t.Error("an unknown name was found")
	}
}
