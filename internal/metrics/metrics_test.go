package metrics_test

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/metrics"
)

func TestExposition(t *testing.T) {
	m := metrics.New()
	m.OrderDone("conditional", "created", 3*time.Millisecond)
	m.OrderDone("conditional", "created", 4*time.Millisecond)
	m.OrderDone("conditional", "busy", time.Second)
	m.Retried("version-cas", "version_moved")
	m.LockAcquired("redis-lock", 2*time.Millisecond)
	m.LockReleased("redis-lock", 5*time.Millisecond, true)
	m.FencedOff("redis-lock")
	m.Renewed(false)
	m.BatchDone(3, 2*time.Millisecond, "created")
	m.ConnOpened()
	m.ConnOpened()
	m.ConnClosed()
	m.ConnEvicted()
	m.ConnRefused("closed")

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	text := string(body)
	for _, want := range []string{
		`stock_orders_total{outcome="created",strategy="conditional"} 2`,
		`stock_orders_total{outcome="busy",strategy="conditional"} 1`,
		`stock_backend_errors_total{kind="busy",strategy="conditional"} 1`,
		`stock_deduction_seconds_count{outcome="created",strategy="conditional"} 2`,
		`stock_retries_total{reason="version_moved",strategy="version-cas"} 1`,
		`stock_lock_wait_seconds_count{strategy="redis-lock"} 1`,
		`stock_locks_lost_total{strategy="redis-lock"} 1`,
		`stock_fenced_off_writes_total{strategy="redis-lock"} 1`,
		`stock_lock_renewals_total{result="failed"} 1`,
		`stock_batch_size_sum{outcome="created"} 3`,
		`stock_batch_tx_seconds_count{outcome="created"} 1`,
		`stock_http_connections_open 1`,
		`stock_http_connections_evicted_total 1`,
		`stock_http_connections_refused_total{how="closed"} 1`,
		`stock_http_connections_refused_total{how="operator_only"} 0`,
		`go_goroutines`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("exposition lacks %s", want)
		}
	}
	// Two registries are independent: no global state.
	other := httptest.NewRecorder()
	metrics.New().Handler().ServeHTTP(other, httptest.NewRequest("GET", "/metrics", nil))
	if strings.Contains(other.Body.String(), `stock_orders_total{`) {
		t.Error("a new Metrics sees another's counts")
	}
}
