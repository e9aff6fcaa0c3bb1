package report

import (
	"io"
	"time"
)

// Reservations is what a burst of redis-reserve or redis-watch left behind
// on its way to the database: the most orders waiting in the streams at
// once (the audit's pending, sampled during the burst), how long the
// instances' consumers took after the burst's last answer to write every
// order, and the time from an order's 201 to its row
// (stock_reserve_write_lag_seconds from the instances' /metrics, all added
// up; bucket bounds: "at most").
type Reservations struct {
	PeakBacklog int64         `json:"peak_backlog"`
	Drain       time.Duration `json:"drain_ns"`
	Written     int64         `json:"written"`
	LagP50Bound time.Duration `json:"lag_p50_bound_ns"`
	LagP99Bound time.Duration `json:"lag_p99_bound_ns"`
	Error       string        `json:"error,omitempty"`
}

// ParseReserveLag reads the Prometheus text of one or more instances and
// returns how many orders were written and the bucket bounds of the 50th
// and 99th percentiles of their time from 201 to row.
func ParseReserveLag(texts ...io.Reader) (written int64, p50, p99 time.Duration, err error) {
	hs, err := readHistograms(texts, "stock_reserve_write_lag_seconds_")
	if err != nil {
		return 0, 0, 0, err
	}
	h := hs["stock_reserve_write_lag_seconds_"]
	if h.count == 0 {
		return 0, 0, 0, nil
	}
	seconds := func(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }
	return int64(h.count), seconds(h.quantile(0.5)), seconds(h.quantile(0.99)), nil
}

// reserveRow is one row of the "from 201 to order row" table.
type reserveRow struct {
	Backend, Strategy, Units, Rate, Written, PeakBacklog, Drain, LagP50, LagP99, Error string
}

// reserveRows lists the bursts of the strategies that write orders to the
// database after answering.
func reserveRows(r *Report, burst []Row) []reserveRow {
	var out []reserveRow
	for _, row := range burst {
		res := row.Run.Reserve
		if res == nil {
			continue
		}
		out = append(out, reserveRow{
			Backend: r.BackendLabel(row.Run.Backend), Strategy: row.Run.Strategy,
			Units: fmtInt(row.Run.Stock), Rate: fmtRate(row.Stats.OrdersPerSec),
			Written: fmtInt(res.Written), PeakBacklog: fmtInt(res.PeakBacklog), Drain: fmtDur(res.Drain),
			LagP50: "≤ " + fmtDur(res.LagP50Bound), LagP99: "≤ " + fmtDur(res.LagP99Bound), Error: res.Error,
		})
	}
	return out
}
