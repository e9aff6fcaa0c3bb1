package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
)

// Summary is the part of a k6 end-of-test summary (the data that
// handleSummary receives, written as JSON by loadtest/*.js) that the report
// reads.
type Summary struct {
	Metrics   map[string]Metric `json:"metrics"`
	RootGroup Group             `json:"root_group"`
	State     struct {
		TestRunDurationMs float64 `json:"testRunDurationMs"`
	} `json:"state"`
	SetupData json.RawMessage `json:"setup_data"`
}

// Metric is one k6 metric's aggregate: a counter has count and rate, a trend
// avg, min, med, max and the configured percentiles ("p(99)"), a gauge
// value, a rate passes and fails.
type Metric struct {
	Type       string             `json:"type"`
	Contains   string             `json:"contains"`
	Values     map[string]float64 `json:"values"`
	Thresholds map[string]struct {
		OK bool `json:"ok"`
	} `json:"thresholds,omitempty"`
}

// Group is a k6 group with its checks; setup and teardown are groups.
type Group struct {
	Name   string  `json:"name"`
	Groups []Group `json:"groups"`
	Checks []Check `json:"checks"`
}

// Check is one named check and how often it passed and failed.
type Check struct {
	Name   string `json:"name"`
	Passes int64  `json:"passes"`
	Fails  int64  `json:"fails"`
}

// ParseSummary reads a k6 summary written by JSON.stringify(data).
func ParseSummary(r io.Reader) (*Summary, error) {
	var s Summary
	dec := json.NewDecoder(r)
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("k6 summary: %w", err)
	}
	if s.Metrics == nil {
		return nil, fmt.Errorf("k6 summary: no metrics")
	}
	return &s, nil
}

// ReadSummary parses the summary in the file at path.
func ReadSummary(path string) (*Summary, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s, err := ParseSummary(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Value returns one statistic of a metric, such as Value("orders", "count")
// or Value("order_latency", "p(99)").
func (s *Summary) Value(metric, stat string) (float64, bool) {
	m, ok := s.Metrics[metric]
	if !ok {
		return 0, false
	}
	v, ok := m.Values[stat]
	if !ok || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// Count returns a counter's count, 0 when k6 never saw it (k6 leaves out a
// counter nothing was added to).
func (s *Summary) Count(metric string) int64 {
	v, _ := s.Value(metric, "count")
	return int64(math.Round(v))
}

// CrossedThresholds lists "metric expression" for every threshold that
// failed, sorted.
func (s *Summary) CrossedThresholds() []string {
	var out []string
	for name, m := range s.Metrics {
		for expr, t := range m.Thresholds {
			if !t.OK {
				out = append(out, name+" "+expr)
			}
		}
	}
	slices.Sort(out)
	return out
}

// GroupChecks returns the checks made in the top-level group of that name
// ("teardown", "setup").
func (s *Summary) GroupChecks(name string) []Check {
	for _, g := range s.RootGroup.Groups {
		if g.Name == name {
			return g.Checks
		}
	}
	return nil
}
