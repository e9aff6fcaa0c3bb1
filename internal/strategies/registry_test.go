package strategies_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/flashsale/stock/internal/strategies"
)

// TestRegistryDescribesEveryStrategy: every name the package defines is
// registered once, with its class, family, invariant, breaking schedule
// and descriptions; the family lists are drawn from it.
func TestRegistryDescribesEveryStrategy(t *testing.T) {
	names := []string{strategies.NameNaive, strategies.NameForUpdate, strategies.NameVersionCAS, strategies.NameConditional,
		strategies.NameBatched, strategies.NameRedisLock, strategies.NameRedlock, strategies.NameEtcdLock, strategies.NameZKLock,
		strategies.NameDBLock, strategies.NameRedisReserve, strategies.NameRedisWatch, strategies.NameLegacyGetset}
	if got := strategies.Names(); !slices.Equal(got, names) {
		t.Errorf("registered %v, want %v", got, names)
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
	}
	for name, want := range map[string][]string{
		"controls": {strategies.NameNaive, strategies.NameLegacyGetset},
	} {
		var got []string
		for _, s := range strategies.All() {
			if strategies.IsControl(s.Name) {
				got = append(got, s.Name)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	if !slices.Equal(strategies.LockNames, []string{strategies.NameRedisLock, strategies.NameRedlock,
		strategies.NameEtcdLock, strategies.NameZKLock, strategies.NameDBLock}) {
		t.Errorf("LockStrategyNames = %v", strategies.LockNames)
	}
	if !slices.Equal(strategies.ReservedNames, []string{strategies.NameRedisReserve, strategies.NameRedisWatch}) {
		t.Errorf("ReservedStrategyNames = %v", strategies.ReservedNames)
	}
	if _, ok := strategies.Lookup("quorum-lock"); ok {
		t.Error("an unknown name was found")
	}
}
