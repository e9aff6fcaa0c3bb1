// Package faults runs the fault scenarios behind make faults (lab/cmd/faults)
// and the short forms in make test (TestShortFaults,
// TestShortCatalogFaults). Each scenario starts real processes on
// 127.0.0.1 — three instances of bin/stock, and the private Redis, etcd,
// ZooKeeper and database servers it breaks — drives them with a bounded Go
// load, injects one fault (kill -9 of an instance or a server, a paused
// lock holder, lost or hung Redis nodes, a restarted or wiped Redis, a
// crashed database, killed consensus leaders, a catalog of 10,000 SKUs
// through the same, a sweeper or the database killed mid-sweep while
// orders come back, the reservation's Redis killed while returns are
// relayed to it, an instance frozen past its sold-out marks' bound while
// units come back through the others), and checks afterwards, from the
// rows and not from the service's word: every 201 is an order row, no SKU
// sold more than its stock, the audit adds up, and each SKU's history is
// linearizable (porcupine; for orders that come back, each order's
// history against a model of its lifecycle, lcModel; for the sold-out
// mark, each SKU's stock history with every sold-out answer allowed to
// rest on a state up to SOLD_OUT_TTL before its call, and no earlier,
// soModel). Rates and 503 counts are checked too: a minority failure
// must not stop sales. It ends only the processes it started, by PID.
//
// docs/faults.md lists the scenarios and what the latest run showed.
package faults
