// Package metrics exposes what the service does in Prometheus format, from a
// registry of its own (no global state): orders by strategy and outcome,
// deduction latency, retries, lock waits and holds, fenced-off writes,
// backend errors and the HTTP connections held against the cap. It
// implements inventory.Observer and connlimit.Observer.
package metrics

import (
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/connlimit"
	"github.com/flashsale/stock/internal/inventory"
)

// Metrics holds the service's collectors and their registry.
type Metrics struct {
	registry *prometheus.Registry
	// outcomes keeps each (strategy, outcome)'s order counter and
	// histogram: OrderDone runs for every order, and the vectors' own
	// lookup hashes the labels and allocates each time. A handful of
	// entries: one strategy per process, a fixed set of outcomes.
	outcomesMu    sync.RWMutex
	outcomes      map[outcomeLabels]outcomeSeries
	orders        *prometheus.CounterVec
	deduction     *prometheus.HistogramVec
	retries       *prometheus.CounterVec
	lockWait      *prometheus.HistogramVec
	lockHold      *prometheus.HistogramVec
	locksLost     *prometheus.CounterVec
	fencedOff     *prometheus.CounterVec
	settled       *prometheus.CounterVec
	renewals      *prometheus.CounterVec
	backendErrors *prometheus.CounterVec
	batchSize     *prometheus.HistogramVec
	batchTx       *prometheus.HistogramVec
	reserveLag    prometheus.Histogram
	reserveWrites *prometheus.CounterVec
	driftSKUs     prometheus.Gauge
	reconciles    prometheus.Counter

	jobRuns, jobFailures        *prometheus.CounterVec
	jobLastRun, jobLastDuration *prometheus.GaugeVec
	inconsistentSKUs            prometheus.Gauge

	connsOpen    prometheus.Gauge
	connsEvicted prometheus.Counter
	connsRefused *prometheus.CounterVec
}

var (
	_ inventory.Observer = (*Metrics)(nil)
	_ batched.Observer   = (*Metrics)(nil)
	_ connlimit.Observer = (*Metrics)(nil)
)

// Latency buckets from 0.5 ms to 10 s: a hot row answers in milliseconds,
// a contended lock in hundreds of them, a timeout in seconds.
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// New returns the collectors, registered with a new registry along with the
// Go runtime and process collectors.
func New() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		orders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stock_orders_total",
			Help: "Orders by strategy and outcome (created, sold_out, limit_reached, not_started, ended, unknown_sku, invalid, idempotency_conflict, busy, unavailable, error).",
		}, []string{"strategy", "outcome"}),
		deduction: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stock_deduction_seconds",
			Help:    "Time to take one order, waits and retries included, by strategy and outcome.",
			Buckets: latencyBuckets,
		}, []string{"strategy", "outcome"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stock_retries_total",
			Help: "Transactions run again, by strategy and reason (version_moved = a lost CAS race, conflict = deadlock or serialisation failure, key_taken).",
		}, []string{"strategy", "reason"}),
		lockWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stock_lock_wait_seconds",
			Help:    "Time waited to acquire a SKU's lock.",
			Buckets: latencyBuckets,
		}, []string{"strategy"}),
		lockHold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stock_lock_hold_seconds",
			Help:    "Time a SKU's lock was held.",
			Buckets: latencyBuckets,
		}, []string{"strategy"}),
		locksLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stock_locks_lost_total",
			Help: "Locks found lost by their holder (expired or taken over before release).",
		}, []string{"strategy"}),
		fencedOff: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stock_fenced_off_writes_total",
			Help: "Writes refused because a newer lock holder had written the row.",
		}, []string{"strategy"}),
		settled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stock_orders_settled_total",
			Help: "Held orders this instance moved out of held, by strategy and new state (paid; cancelled and expired gave their units back).",
		}, []string{"strategy", "state"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stock_lock_renewals_total",
			Help: "Watchdog renewals of held locks, by result (ok, failed).",
		}, []string{"result"}),
		backendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stock_backend_errors_total",
			Help: "Orders that failed on a backend, by kind (busy, unavailable, error).",
		}, []string{"strategy", "kind"}),
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stock_batch_size",
			Help:    "Orders in one batch of the batched strategy, by outcome of its transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10), // 1 to 512
		}, []string{"outcome"}),
		batchTx: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stock_batch_tx_seconds",
			Help:    "Time of one batch's transaction (retries and the lookup after a lost commit answer included), by outcome.",
			Buckets: latencyBuckets,
		}, []string{"outcome"}),
		reserveLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "stock_reserve_write_lag_seconds",
			Help:    "redis-reserve: time from an order's acceptance in Redis (its 201) to its commit in the database.",
			Buckets: latencyBuckets,
		}),
		reserveWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stock_reserve_batches_total",
			Help: "redis-reserve: batches of streamed orders the consumer wrote to the database, by result (ok, failed: left pending and tried again).",
		}, []string{"result"}),
		driftSKUs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stock_reserve_drift_skus",
			Help: "redis-reserve, redis-watch: SKUs whose Redis and database disagreed at the last reconciliation this instance ran.",
		}),
		reconciles: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stock_reserve_reconciliations_total",
			Help: "redis-reserve, redis-watch: reconciliations this instance ran (one instance at a time runs one).",
		}),
		jobRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stock_job_runs_total",
			Help: "Periodic jobs this instance ran (each period's run happens on one instance of all), failed or not.",
		}, []string{"job"}),
		jobFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stock_job_failures_total",
			Help: "Runs of periodic jobs on this instance that failed (each logged with its error).",
		}, []string{"job"}),
		jobLastRun: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stock_job_last_run_timestamp_seconds",
			Help: "When this instance last began a run of the job (Unix time).",
		}, []string{"job"}),
		jobLastDuration: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stock_job_last_run_duration_seconds",
			Help: "How long this instance's last run of the job took.",
		}, []string{"job"}),
		inconsistentSKUs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stock_audit_inconsistent_skus",
			Help: "SKUs found inconsistent by the last audit run on this instance (AUDIT_EVERY): initial != available + ordered, available < 0, or drift.",
		}),
		connsOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stock_http_connections_open",
			Help: "HTTP connections this instance holds, counted against HTTP_MAX_CONNS and the operator headroom above it.",
		}),
		connsEvicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stock_http_connections_evicted_total",
			Help: "Idle keep-alive HTTP connections closed at HTTP_MAX_CONNS to make room for a new connection.",
		}),
		connsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stock_http_connections_refused_total",
			Help: "HTTP connections that arrived at HTTP_MAX_CONNS with none idle, by how they were refused (operator_only: served /healthz, /readyz and /metrics only, 503 for the rest; closed: beyond the headroom, closed at once).",
		}, []string{"how"}),
	}
	// Both series exist, at 0, from the start: an alert on their rate
	// needs no data to appear first.
	m.connsRefused.WithLabelValues(connlimit.RefusedOperatorOnly)
	m.connsRefused.WithLabelValues(connlimit.RefusedClosed)
	m.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.orders, m.deduction, m.retries, m.lockWait, m.lockHold, m.locksLost, m.fencedOff, m.settled, m.renewals, m.backendErrors,
		m.batchSize, m.batchTx, m.reserveLag, m.reserveWrites, m.driftSKUs, m.reconciles,
		m.jobRuns, m.jobFailures, m.jobLastRun, m.jobLastDuration, m.inconsistentSKUs,
		m.connsOpen, m.connsEvicted, m.connsRefused,
	)
	return m
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry})
}

type outcomeLabels struct{ strategy, outcome string }

type outcomeSeries struct {
	orders    prometheus.Counter
	deduction prometheus.Observer
}

// series returns the order counter and histogram of strategy and outcome.
func (m *Metrics) series(strategy, outcome string) outcomeSeries {
	key := outcomeLabels{strategy, outcome}
	m.outcomesMu.RLock()
	s, ok := m.outcomes[key]
	m.outcomesMu.RUnlock()
	if ok {
		return s
	}
	s = outcomeSeries{orders: m.orders.WithLabelValues(strategy, outcome), deduction: m.deduction.WithLabelValues(strategy, outcome)}
	m.outcomesMu.Lock()
	if m.outcomes == nil {
		m.outcomes = map[outcomeLabels]outcomeSeries{}
	}
	m.outcomes[key] = s
	m.outcomesMu.Unlock()
	return s
}

// OrderDone implements inventory.Observer.
func (m *Metrics) OrderDone(strategy, outcome string, elapsed time.Duration) {
	s := m.series(strategy, outcome)
	s.orders.Inc()
	s.deduction.Observe(elapsed.Seconds())
	switch outcome {
	case "busy", "unavailable", "error":
		m.backendErrors.WithLabelValues(strategy, outcome).Inc()
	}
}

// Retried implements inventory.Observer.
func (m *Metrics) Retried(strategy, reason string) {
	m.retries.WithLabelValues(strategy, reason).Inc()
}

// LockAcquired implements inventory.Observer.
func (m *Metrics) LockAcquired(strategy string, waited time.Duration) {
	m.lockWait.WithLabelValues(strategy).Observe(waited.Seconds())
}

// LockReleased implements inventory.Observer.
func (m *Metrics) LockReleased(strategy string, held time.Duration, lost bool) {
	m.lockHold.WithLabelValues(strategy).Observe(held.Seconds())
	if lost {
		m.locksLost.WithLabelValues(strategy).Inc()
	}
}

// OrderSettled implements inventory.Observer.
func (m *Metrics) OrderSettled(strategy, to string) {
	m.settled.WithLabelValues(strategy, to).Inc()
}

// FencedOff implements inventory.Observer.
func (m *Metrics) FencedOff(strategy string) {
	m.fencedOff.WithLabelValues(strategy).Inc()
}

// Renewed counts one watchdog renewal; ok is false when it failed.
func (m *Metrics) Renewed(ok bool) {
	result := "ok"
	if !ok {
		result = "failed"
	}
	m.renewals.WithLabelValues(result).Inc()
}

// BatchDone implements batched.Observer.
func (m *Metrics) BatchDone(size int, elapsed time.Duration, outcome string) {
	m.batchSize.WithLabelValues(outcome).Observe(float64(size))
	m.batchTx.WithLabelValues(outcome).Observe(elapsed.Seconds())
}

// Written implements reservation.Observer.
func (m *Metrics) Written(_ string, lags []time.Duration) {
	m.reserveWrites.WithLabelValues("ok").Inc()
	for _, l := range lags {
		m.reserveLag.Observe(l.Seconds())
	}
}

// Failed implements reservation.Observer.
func (m *Metrics) Failed(string) {
	m.reserveWrites.WithLabelValues("failed").Inc()
}

// JobAdded implements jobs.Observer: the job's series exist, at 0, from
// the start, so that a dashboard tells "never ran here" from "no data".
func (m *Metrics) JobAdded(job string) {
	m.jobRuns.WithLabelValues(job)
	m.jobFailures.WithLabelValues(job)
}

// JobRan implements jobs.Observer.
func (m *Metrics) JobRan(job string, began time.Time, took time.Duration, err error) {
	m.jobRuns.WithLabelValues(job).Inc()
	if err != nil {
		m.jobFailures.WithLabelValues(job).Inc()
	}
	m.jobLastRun.WithLabelValues(job).Set(float64(began.UnixNano()) / 1e9)
	m.jobLastDuration.WithLabelValues(job).Set(took.Seconds())
}

// Audited implements jobs.AuditObserver.
func (m *Metrics) Audited(_, inconsistent int) {
	m.inconsistentSKUs.Set(float64(inconsistent))
}

// Reconciled implements reservation.ReconcileObserver.
func (m *Metrics) Reconciled(_, drifting int) {
	m.reconciles.Inc()
	m.driftSKUs.Set(float64(drifting))
}

// ConnOpened implements connlimit.Observer.
func (m *Metrics) ConnOpened() { m.connsOpen.Inc() }

// ConnClosed implements connlimit.Observer.
func (m *Metrics) ConnClosed() { m.connsOpen.Dec() }

// ConnEvicted implements connlimit.Observer.
func (m *Metrics) ConnEvicted() { m.connsEvicted.Inc() }

// ConnRefused implements connlimit.Observer.
func (m *Metrics) ConnRefused(how string) { m.connsRefused.WithLabelValues(how).Inc() }
