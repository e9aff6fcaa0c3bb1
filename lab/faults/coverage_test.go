package faults

import (
	"context"
	"testing"

	"github.com/flashsale/stock/internal/strategies"
)

// TestEverySafeStrategyFacesTheFaults: every safe strategy of the registry
// is in a run of the fault suite, and every one that keeps no lock outside
// the database or the reservation's Redis is killed with kill -9 mid-load
// (scenario 1). A strategy added to the registry fails here until the
// suite runs it. The controls are shown overselling by the conformance
// test and the explorer; the suite runs legacy-getset's paused holder.
func TestEverySafeStrategyFacesTheFaults(t *testing.T) {
	steps := (&Env{}).steps(context.Background())
	in := map[string]bool{}
	killed := map[string]bool{}
	for _, s := range steps {
		if _, ok := strategies.Lookup(s.strategy); !ok {
			t.Errorf("a step of scenario %d runs %q, which is not a registered strategy", s.scenario, s.strategy)
		}
		in[s.strategy] = true
		if s.scenario == 1 {
			killed[s.strategy] = true
		}
	}
	for _, s := range strategies.All() {
		if !s.Safe() {
			continue
		}
		if !in[s.Name] {
			t.Errorf("%s is in no fault scenario", s.Name)
		}
		// redis-lock and redlock face the loss of their servers and a
		// paused holder (scenarios 2-4) instead.
		if s.Family != strategies.FamilyLock || !s.NeedsServer(strategies.ServerRedis) && !s.NeedsServer(strategies.ServerRedisQuorum) {
			if !killed[s.Name] {
				t.Errorf("%s is never killed with kill -9 (scenario 1)", s.Name)
			}
		}
	}
}
