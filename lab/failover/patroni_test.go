package failover_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testpatroni"
	"github.com/flashsale/stock/lab/teststrategy"
)

// The service on a PostgreSQL cluster run by Patroni (lab/testpatroni):
// what synchronous replication promises an order answered 201, and what
// the service must answer when a commit is caught between the primary and
// its synchronous standby.

// patroniDatabase creates a database of a random name on c's primary,
// migrates it, and returns its name. The cluster is the test's own: it
// goes with the database when the test ends.
func patroniDatabase(ctx context.Context, t *testing.T, c *testpatroni.Cluster) string {
	t.Helper()
	name := "sales_" + strings.ToLower(rand.Text()[:12])
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatalf("connect to the primary: %v", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	// A synchronous commit returns once a standby has the WAL, not once it
	// has replayed it; and pgx tries no further host after one that says
	// the database does not exist (3D000): wait until the replicas have it.
	primary, err := c.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Members {
		if m != primary && m.Running() {
			if err := m.CatchUp(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	db := openPatroni(ctx, t, c, name, 2)
	if err := db.Migrate(ctx); err != nil {
		t.Fatalf("migrate %s: %v", name, err)
	}
	return name
}

// openPatroni is an instance's store of database name, through the URL
// that names every member (the one that takes writes is used), closed
// when t ends.
func openPatroni(ctx context.Context, t *testing.T, c *testpatroni.Cluster, name string, maxConns int) store.Store {
	t.Helper()
	db, err := store.Open(ctx, c.URL(name), maxConns)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	t.Cleanup(db.Close)
	return db
}

// patroniService is one instance of strategy over database name, with a
// store of its own.
func patroniService(ctx context.Context, t *testing.T, c *testpatroni.Cluster, name, strategy string, timeout time.Duration) (*sales.Service, store.Store) {
	t.Helper()
	e, ok := strategies.Lookup(strategy)
	if !ok {
		t.Fatalf("no strategy %s", strategy)
	}
	db := openPatroni(ctx, t, c, name, 4)
	return sales.NewService(db, teststrategy.Build(t, teststrategy.Config(t, e, c.URL(name)), db), sales.WithOrderTimeout(timeout)), db
}

// primaryAndStandby are c's primary and its other member (c has two).
func primaryAndStandby(ctx context.Context, t *testing.T, c *testpatroni.Cluster) (primary, standby *testpatroni.Member) {
	t.Helper()
	primary, err := c.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Members {
		if m != primary {
			standby = m
		}
	}
	return primary, standby
}

// ordersOf is what the database holds of buyer's orders of sku.
func ordersOf(ctx context.Context, t *testing.T, db store.Store, buyer, sku string) int {
	t.Helper()
	orders, err := db.ListOrders(ctx, buyer, sku, "", 10)
	if err != nil {
		t.Fatalf("list %s's orders: %v", buyer, err)
	}
	return len(orders)
}

// A backend that waits at COMMIT for its synchronous standby has
// committed locally already. Ended then (pg_terminate_backend, or the
// fast shutdown of a Patroni demotion), it sends only a WARNING ("the
// transaction has already committed locally, but might not have been
// replicated to the standby") and closes the connection with no error
// (syncrep.c turns its output off before the FATAL): pgx reports "conn
// closed", and the order's row is in the database. The service must not
// answer that order "not taken, nothing deducted": either 201 (a lookup
// found the order) or outcome unknown.
func TestACommitEndedWhileWaitingForItsSynchronousStandbyIsNotAnsweredAsRolledBack(t *testing.T) {
	endTheWaitingCommit(t, "pg_terminate_backend")
}

// A backend whose wait for its synchronous standby is cancelled
// (pg_cancel_backend, or a statement_timeout) answers its COMMIT as done,
// with only the warning that the transaction "might not have been
// replicated to the standby": pgx returns no error. The service must not
// answer 201 for an order the standby does not have (found by review: it
// did): the commit is an unknown outcome, and while the standby lags its
// answer is 503, may have been taken.
func TestACommitWhoseWaitForItsSynchronousStandbyIsCancelledIsNotAnswered201(t *testing.T) {
	endTheWaitingCommit(t, "pg_cancel_backend")
}

// endTheWaitingCommit has an order's COMMIT wait for a frozen synchronous
// standby, ends the wait with end (pg_terminate_backend or
// pg_cancel_backend), and checks the answer: never 201 while the standby
// lacks the order, never "not taken" for an order in the database.
func endTheWaitingCommit(t *testing.T, end string) {
	c := testpatroni.Start(t, testpatroni.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	name := patroniDatabase(ctx, t, c)
	// The order's deadline outlasts the test's waits: the commit is ended
	// by the terminate, not by the service's timeout.
	svc, db := patroniService(ctx, t, c, name, strategies.NameConditional, 30*time.Second)
	const sku, buyer = "sync-wait", "waiting-buyer"
	if err := svc.StartSale(ctx, sku, 10); err != nil {
		t.Fatalf("start sale: %v", err)
	}
	primary, standby := primaryAndStandby(ctx, t, c)
	if err := standby.FreezeReplication(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(standby.ThawReplication)
	if role, err := standby.Role(ctx); err != nil || role != "sync_standby" {
		t.Fatalf("the frozen standby %s: role %q (%v), want Patroni to keep it the synchronous standby", standby.Name, role, err)
	}

	answered := endWaitingCommit(ctx, t, svc, inventory.Request{SKU: sku, Quantity: 1, UserID: buyer}, primary, name, end)
	var r teststrategy.Answer
	if end == "pg_cancel_backend" {
		// Answered while the standby still lacks the order: never 201.
		select {
		case r = <-answered:
		case <-ctx.Done():
			t.Fatal("the order was not answered within 2 minutes")
		}
		if r.Err == nil {
			t.Errorf("order %s answered 201 while its synchronous standby does not have it", r.Order.ID)
		}
		standby.ThawReplication()
	} else {
		// The lookup that settles an unknown outcome takes the SKU's row,
		// so its own commit waits for the standby too.
		standby.ThawReplication()
		select {
		case r = <-answered:
		case <-ctx.Done():
			t.Fatal("the order was not answered within 2 minutes")
		}
	}

	audit, err := svc.Audit(ctx, sku)
	if err != nil {
		t.Fatalf("audit: %v", err)
	}
	rows := ordersOf(ctx, t, db, buyer, sku)
	t.Logf("answer: order %q, err %v; the database has %d order(s) for the buyer; audit %+v", r.Order.ID, r.Err, rows, audit)
	switch {
	case r.Err == nil:
		if _, found, err := db.FindOrder(ctx, r.Order.ID); err != nil || !found {
			t.Errorf("order %s answered 201 is not in the database (found %v, %v)", r.Order.ID, found, err)
		}
	case errors.Is(r.Err, inventory.ErrOutcomeUnknown):
	default:
		t.Errorf("answered %q (not taken, nothing deducted), yet the database has %d order(s) for the buyer: want 201 or outcome unknown", r.Err, rows)
	}
	if audit.Initial != audit.Available+audit.Ordered {
		t.Errorf("not conserved: %+v", audit)
	}
}

// endWaitingCommit places req through svc in the background, waits until
// its COMMIT waits for the synchronous standby (wait_event SyncRep on
// primary's database db), and ends that wait with end
// (pg_terminate_backend or pg_cancel_backend). The order's answer comes on
// the channel returned; t fails if it comes before the wait.
func endWaitingCommit(ctx context.Context, t *testing.T, svc *sales.Service, req inventory.Request, primary *testpatroni.Member, db, end string) <-chan teststrategy.Answer {
	t.Helper()
	answered := make(chan teststrategy.Answer, 1)
	go func() {
		o, err := svc.PlaceOrder(ctx, req)
		answered <- teststrategy.Answer{Quantity: req.Quantity, Order: o, Err: err}
	}()
	admin, err := pgx.Connect(ctx, primary.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	var pid int
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = $1 AND wait_event = 'SyncRep'`, db).Scan(&pid)
		if err == nil {
			break
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatalf("find the backend waiting for the standby: %v", err)
		}
		select {
		case <-tick.C:
		case r := <-answered:
			t.Fatalf("the order was answered (%+v, %v) before its commit waited for the frozen standby", r.Order, r.Err)
		case <-ctx.Done():
			t.Fatal("no backend waited for the frozen standby within 2 minutes")
		}
	}
	var ended bool
	if err := admin.QueryRow(ctx, `SELECT `+end+`($1)`, pid).Scan(&ended); err != nil || !ended {
		t.Fatalf("%s of backend %d: %v, %v", end, pid, ended, err)
	}
	return answered
}

// request is one order a buyer placed, and its answer.
type request struct {
	sku, buyer string
	order      inventory.Order
	err        error
	afterKill  bool // sent after the primary was killed
	at         time.Time
}

// Under synchronous replication a commit returns once the standby has
// the order: the order answered 201 survives a kill -9 of the primary.
// Two instances of each of conditional and batched sell through a
// failover: every order answered 201 is on the new primary, the stock is
// conserved, no request is answered "not taken" for an order that is in
// the database, and every failure is a 503 (or busy), never an
// unclassified error.
func TestOrdersAnswered201BeforeAPatroniFailoverAreOnTheNewPrimary(t *testing.T) {
	const initial, before, after, workers = 100000, 50, 50, 8 // before, after: 201s per strategy
	c := testpatroni.Start(t, testpatroni.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	name := patroniDatabase(ctx, t, c)
	names := []string{strategies.NameConditional, strategies.NameBatched}
	var svcs []*sales.Service // two instances per strategy
	for _, strategy := range names {
		for range 2 {
			svc, _ := patroniService(ctx, t, c, name, strategy, 5*time.Second)
			svcs = append(svcs, svc)
		}
		if err := svcs[len(svcs)-1].StartSale(ctx, "failover-"+strategy, initial); err != nil {
			t.Fatalf("start sale: %v", err)
		}
	}
	primary, _ := primaryAndStandby(ctx, t, c)

	var (
		stop      atomic.Bool
		killedAt  atomic.Int64 // unix nanoseconds; 0 before the kill
		created   [2][2]atomic.Int64
		results   = make([][]request, workers)
		wg        sync.WaitGroup
		deadlines = [2]time.Duration{time.Minute, 2 * time.Minute}
	)
	for w := range workers {
		wg.Go(func() {
			s := w % 4 / 2 // the strategy's index in names
			svc, sku := svcs[w%4], "failover-"+names[s]
			for i, streak := 0, 0; !stop.Load(); i++ {
				r := request{sku: sku, buyer: fmt.Sprintf("w%d-%d", w, i), afterKill: killedAt.Load() != 0}
				r.order, r.err = svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: r.buyer})
				r.at = time.Now()
				results[w] = append(results[w], r)
				if r.err == nil {
					created[s][btoi(r.afterKill)].Add(1)
					streak = 0
					continue
				}
				// A client backs off after a 503 rather than hammer a
				// cluster that is failing over.
				_ = backoff.Wait(ctx, backoff.Exponential(streak, 5*time.Millisecond, 200*time.Millisecond))
				streak++
			}
		})
	}
	reached := func(phase int, n int64) bool {
		return created[0][phase].Load() >= n && created[1][phase].Load() >= n
	}
	wait := func(phase int, n int64) error {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		limit := time.NewTimer(deadlines[phase])
		defer limit.Stop()
		for !reached(phase, n) {
			select {
			case <-tick.C:
			case <-limit.C:
				return fmt.Errorf("within %s: %d (%s) and %d (%s) orders answered 201, want %d each",
					deadlines[phase], created[0][phase].Load(), names[0], created[1][phase].Load(), names[1], n)
			}
		}
		return nil
	}
	err := wait(0, before)
	if err == nil {
		killed := time.Now()
		if err = primary.Kill(); err == nil {
			killedAt.Store(killed.UnixNano())
			err = wait(1, after)
		}
	}
	stop.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatalf("primary %s (killed: %v): %v", primary.Name, killedAt.Load() != 0, err)
	}

	// The survivor, through a store of its own: the instances' pools may
	// still hold connections that failed.
	db := openPatroni(ctx, t, c, name, 2)
	killed := time.Unix(0, killedAt.Load())
	var (
		firstAfter             time.Time
		unavailable, unknown   int
		busy, missing, refuted int
		failures               []error
	)
	for _, rs := range results {
		for _, r := range rs {
			switch {
			case r.err == nil:
				if r.afterKill && (firstAfter.IsZero() || r.at.Before(firstAfter)) {
					firstAfter = r.at
				}
				if _, found, err := db.FindOrder(ctx, r.order.ID); err != nil || !found {
					missing++
					t.Errorf("order %s of %s answered 201 is not on the new primary (found %v, %v)", r.order.ID, r.sku, found, err)
				}
				continue
			case errors.Is(r.err, inventory.ErrOutcomeUnknown):
				unknown++
				continue // either way is a true answer
			case errors.Is(r.err, inventory.ErrUnavailable):
				unavailable++
			case errors.Is(r.err, inventory.ErrBusy), errors.Is(r.err, inventory.ErrSoldOut):
				busy++
			default:
				failures = append(failures, r.err)
			}
			// Every answer but outcome unknown says nothing was taken.
			if n := ordersOf(ctx, t, db, r.buyer, r.sku); n > 0 {
				refuted++
				t.Errorf("%s's order of %s was answered %q (nothing taken), yet the database has it", r.buyer, r.sku, r.err)
			}
		}
	}
	if len(failures) > 0 {
		t.Errorf("%d orders failed with neither a 201 nor a 503 nor busy, first: %v", len(failures), failures[0])
	}
	for s, strategy := range names {
		sku := "failover-" + strategy
		audit, err := db.Audit(ctx, sku) // neither strategy keeps books of its own
		if err != nil {
			t.Fatalf("audit %s: %v", sku, err)
		}
		answered := created[s][0].Load() + created[s][1].Load()
		t.Logf("%s: %d orders answered 201 (%d after the kill); audit %+v", strategy, answered, created[s][1].Load(), audit)
		if audit.Initial != audit.Available+audit.Ordered {
			t.Errorf("%s: not conserved: %+v", strategy, audit)
		}
		if audit.Orders < answered {
			t.Errorf("%s: %d orders answered 201, the new primary has %d", strategy, answered, audit.Orders)
		}
	}
	t.Logf("killed primary %s: first 201 of a request sent after the kill %s later; %d answered 503 not taken, %d 503 outcome unknown, %d busy; %d answered 201 missing, %d refuted",
		primary.Name, firstAfter.Sub(killed).Round(time.Millisecond), unavailable, unknown, busy, missing, refuted)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// The control for the test above: with asynchronous replication, a
// standby that lagged (its replication frozen) when the primary died is
// promoted all the same, within Patroni's maximum_lag_on_failover (1 MiB
// here), and orders answered 201 on the old primary are gone. This is
// what synchronous replication prevents, and shows that the tests above
// can see a lost order.
func TestAnAsynchronousStandbyPromotedAfterItLaggedLosesOrdersAnswered201(t *testing.T) {
	const orders = 10
	c := testpatroni.Start(t, testpatroni.Options{Async: true})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	name := patroniDatabase(ctx, t, c)
	svc, db := patroniService(ctx, t, c, name, strategies.NameConditional, 5*time.Second)
	const sku = "async-lag"
	if err := svc.StartSale(ctx, sku, 1000); err != nil {
		t.Fatalf("start sale: %v", err)
	}
	primary, standby := primaryAndStandby(ctx, t, c)
	// The database, its schema and the sale are on the standby; the
	// orders will not be.
	if err := standby.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.FreezeReplication(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(standby.ThawReplication)
	var ids []string
	for i := range orders {
		o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: fmt.Sprintf("buyer-%d", i)})
		if err != nil {
			t.Fatalf("order %d with the standby frozen: %v (asynchronous commits do not wait for it)", i, err)
		}
		ids = append(ids, o.ID)
	}
	admin, err := pgx.Connect(ctx, primary.URL(name))
	if err != nil {
		t.Fatal(err)
	}
	var lag int64
	err = admin.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint FROM pg_stat_replication WHERE application_name = $1`, standby.Name).Scan(&lag)
	_ = admin.Close(ctx)
	if err != nil {
		t.Fatalf("the standby's lag: %v", err)
	}

	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	standby.ThawReplication()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		p, err := c.Primary(ctx)
		if err == nil && p == standby {
			break
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("Patroni did not promote the standby %s, %d bytes of WAL behind: %v\n%s", standby.Name, lag, err, standby.Log())
		}
	}
	t.Logf("killed primary %s with its standby %d bytes of WAL behind (the flush it acknowledged); %s promoted %s later",
		primary.Name, lag, standby.Name, time.Since(killed).Round(time.Millisecond))

	lost := 0
	for _, id := range ids {
		_, found, err := findOrderAfterFailover(ctx, db, id)
		if err != nil {
			t.Fatalf("look order %s up on the promoted standby: %v", id, err)
		}
		if !found {
			lost++
		}
	}
	audit, err := svc.Audit(ctx, sku)
	t.Logf("%d of %d orders answered 201 are not on the promoted standby; audit %+v (%v)", lost, orders, audit, err)
	if lost == 0 {
		t.Errorf("every order answered 201 is on the promoted standby: the control shows no loss, so the frozen replication let WAL through")
	}
}

// findOrderAfterFailover is db.FindOrder, tried again with a backoff
// while the pool still meets the dead primary's connections, within ctx.
func findOrderAfterFailover(ctx context.Context, db store.Store, id string) (inventory.Order, bool, error) {
	for attempt := 0; ; attempt++ {
		o, found, err := db.FindOrder(ctx, id)
		if err == nil || !errors.Is(err, inventory.ErrUnavailable) {
			return o, found, err
		}
		if werr := backoff.Wait(ctx, backoff.Exponential(attempt, 10*time.Millisecond, 500*time.Millisecond)); werr != nil {
			return o, found, errors.Join(err, werr)
		}
	}
}
