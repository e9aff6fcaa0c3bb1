package strategies_test

import (
	"testing"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/strategies"
)

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
