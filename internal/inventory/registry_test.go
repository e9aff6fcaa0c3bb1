package inventory_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
)

// TestRegistryDescribesEveryStrategy: every name the package defines is
// registered once, with its class, family, invariant, breaking schedule
// and descriptions; the family lists are drawn from it.
func TestRegistryDescribesEveryStrategy(t *testing.T) {
	names := []string{inventory.NameNaive, inventory.NameForUpdate, inventory.NameVersionCAS, inventory.NameConditional,
		inventory.NameBatched, inventory.NameRedisLock, inventory.NameRedlock, inventory.NameEtcdLock, inventory.NameZKLock,
		inventory.NameDBLock, inventory.NameRedisReserve, inventory.NameRedisWatch, inventory.NameLegacyGetset}
	if got := inventory.StrategyNames(); !slices.Equal(got, names) {
		t.Errorf("registered %v, want %v", got, names)
	}
	for _, s := range inventory.Strategies() {
		if s.Class != inventory.ClassSafe && s.Class != inventory.ClassControl {
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
		"controls": {inventory.NameNaive, inventory.NameLegacyGetset},
	} {
		var got []string
		for _, s := range inventory.Strategies() {
			if inventory.IsControl(s.Name) {
				got = append(got, s.Name)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	if !slices.Equal(inventory.LockStrategyNames, []string{inventory.NameRedisLock, inventory.NameRedlock,
		inventory.NameEtcdLock, inventory.NameZKLock, inventory.NameDBLock}) {
		t.Errorf("LockStrategyNames = %v", inventory.LockStrategyNames)
	}
	if !slices.Equal(inventory.ReservedStrategyNames, []string{inventory.NameRedisReserve, inventory.NameRedisWatch}) {
		t.Errorf("ReservedStrategyNames = %v", inventory.ReservedStrategyNames)
	}
	if _, ok := inventory.LookupStrategy("quorum-lock"); ok {
		t.Error("an unknown name was found")
	}
}
