package strategies

import "testing"

// TestBatchLanesLeftUnsetAreTheEngines: BATCH_LANES unset gives one lane
// on PostgreSQL and two on MariaDB (what sold the most in the demo's
// catalog); set, it is taken as it is, 0 included.
func TestBatchLanesLeftUnsetAreTheEngines(t *testing.T) {
	for _, c := range []struct {
		url   string
		lanes int
		want  int
	}{
		{"postgres://127.0.0.1/stock", LanesByEngine, 1},
		{"mysql://root@127.0.0.1/stock", LanesByEngine, 2},
		{"mysql://root@127.0.0.1/stock", 0, 0},
		{"postgres://127.0.0.1/stock", 8, 8},
		{"", LanesByEngine, 1},
	} {
		cfg := Defaults()
		cfg.DatabaseURL, cfg.BatchLanes = c.url, c.lanes
		if got := batchLanes(cfg); got != c.want {
			t.Errorf("%s with BATCH_LANES %d: %d lanes, want %d", c.url, c.lanes, got, c.want)
		}
	}
}
