package strategies_test

import (
	"testing"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/strategies"
)

// TestEveryStrategyHasAnEntry: the registry builds every strategy
// STRATEGY names, and nothing else.
func TestEveryStrategyHasAnEntry(t *testing.T) {
	all := strategies.All()
	if len(all) != len(strategies.All()) {
		t.Fatalf("%d entries for %d strategies", len(all), len(strategies.All()))
	}
	for _, e := range all {
		if e.Build == nil {
			t.Errorf("%s has no Build", e.Name)
		}
		if e.Invariant == "" || e.Breaks == "" {
			t.Errorf("%s says no invariant or no schedule that breaks it", e.Name)
		}
	}
}

// TestSettingsAreRefusedWhereNoOneReadsThem: a setting only some
// strategies read is refused, by name, under every other strategy.
func TestSettingsAreRefusedWhereNoOneReadsThem(t *testing.T) {
	for _, e := range strategies.All() {
		cfg := strategies.Config{Strategy: e.Name, RedisAddrs: []string{"a", "b", "c"}, LockTTL: 5e9}
		if err := strategies.Check(cfg, func(string) bool { return false }); err != nil {
			t.Errorf("%s with nothing set: %v", e.Name, err)
		}
		err := strategies.Check(cfg, func(s string) bool { return s == "BATCH_MAX" })
		if reads := e.Name == batched.Name; reads != (err == nil) {
			t.Errorf("%s with BATCH_MAX: %v", e.Name, err)
		}
	}
}
