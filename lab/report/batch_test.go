package report

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseBatchMetrics(t *testing.T) {
	i1 := `# HELP stock_batch_size Orders in one batch.
# TYPE stock_batch_size histogram
stock_batch_size_bucket{outcome="created",le="1"} 2
stock_batch_size_bucket{outcome="created",le="4"} 5
stock_batch_size_bucket{outcome="created",le="16"} 9
stock_batch_size_bucket{outcome="created",le="+Inf"} 10
stock_batch_size_sum{outcome="created"} 80
stock_batch_size_count{outcome="created"} 10
stock_batch_tx_seconds_bucket{outcome="created",le="0.005"} 10
stock_batch_tx_seconds_bucket{outcome="created",le="+Inf"} 10
stock_batch_tx_seconds_sum{outcome="created"} 0.02
stock_batch_tx_seconds_count{outcome="created"} 10
stock_orders_total{strategy="batched",outcome="created"} 80
`
	i2 := `stock_batch_size_bucket{outcome="created",le="1"} 0
stock_batch_size_bucket{outcome="created",le="4"} 0
stock_batch_size_bucket{outcome="created",le="16"} 10
stock_batch_size_bucket{outcome="created",le="+Inf"} 10
stock_batch_size_sum{outcome="created"} 120
stock_batch_size_count{outcome="created"} 10
`
	b, err := ParseBatchMetrics(strings.NewReader(i1), strings.NewReader(i2))
	if err != nil {
		t.Fatal(err)
	}
	if b == nil || b.Count != 20 || b.Orders != 200 || b.Mean != 10 {
		t.Fatalf("got %+v, want 20 batches of 200 orders, mean 10", b)
	}
	// 19 of 20 batches hold at most 16 orders: the 99th percentile is in
	// the +Inf bucket.
	if b.P50Bound != 16 || !math.IsInf(b.P99Bound, 1) || b.TxMean != 2*time.Millisecond {
		t.Errorf("p50 ≤ %v, p99 ≤ %v, tx mean %v; want 16, +Inf, 2ms", b.P50Bound, b.P99Bound, b.TxMean)
	}
	none, err := ParseBatchMetrics(strings.NewReader("stock_orders_total 3\n"))
	if err != nil || none != nil {
		t.Errorf("no batch metrics: got %+v, %v", none, err)
	}
}

func TestGoBurstProblems(t *testing.T) {
	ok := GoBurst{Orders: 5, Audit: &Audit{Initial: 5, Available: 0, Ordered: 5, Orders: 5, Consistent: true}}
	if p := ok.Problems(); len(p) != 0 {
		t.Errorf("clean burst: %v", p)
	}
	lost := GoBurst{Orders: 6, Audit: &Audit{Initial: 5, Available: 0, Ordered: 5, Orders: 5, Consistent: true}}
	if p := lost.Problems(); len(p) != 1 {
		t.Errorf("a 201 without its order row: %v", p)
	}
	r := &Report{GoBursts: []GoBurst{lost}}
	if f := r.Failures(); len(f) != 1 {
		t.Errorf("failures: %v", f)
	}
}
