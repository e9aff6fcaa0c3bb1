package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/testdb"
)

// lifecycleAudit is the part of GET /admin/audit/{sku} the lifecycle's
// faults are checked against.
type lifecycleAudit struct {
	Initial, Available, Ordered, Held, Paid, Returned, Expired, Cancelled int64
	Consistent                                                            bool
}

func auditOf(t *testing.T, p *process, sku string) lifecycleAudit {
	t.Helper()
	var a lifecycleAudit
	adminJSON(t, http.MethodGet, p.url+"/admin/audit/"+sku, "", &a)
	return a
}

// waitAudit polls an instance's audit of sku until done says it is what
// the test waits for: the expiry under test happens in other processes, on
// the database's clock, and the rows are the only signal there is.
func waitAudit(t *testing.T, p *process, sku string, within time.Duration, done func(lifecycleAudit) bool) lifecycleAudit {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		a := auditOf(t, p, sku)
		if done(a) {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v the audit of %s is %+v", within, sku, a)
		}
		time.Sleep(50 * time.Millisecond) // polling other processes' rows
	}
}

// TestPausedInstancePaysPastTheExpiry: an instance is frozen (SIGSTOP)
// with its buyer's pay in its socket; the hold lapses, and another
// instance's sweep gives the unit back. When the frozen instance wakes and
// serves the pay, the database's clock decides: 409 expired, the order
// stays expired, and the unit came back once.
func TestPausedInstancePaysPastTheExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real service processes")
	}
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			url := testdb.URL(t, engine)
			payer := startInstance(t, "DATABASE_URL="+url, "STRATEGY=conditional", "HOLD_TTL=1s", "HOLD_SWEEP_EVERY=0")
			sweeper := startInstance(t, "DATABASE_URL="+url, "STRATEGY=conditional", "HOLD_TTL=1s", "HOLD_SWEEP_EVERY=100ms")
			adminJSON(t, http.MethodPut, payer.url+"/admin/stock/paused", `{"available":1}`, nil)
			id := placeHeld(t, payer.url, "paused", "buyer")

			if err := payer.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			waitStopped(t, payer.cmd.Process.Pid)
			paid := make(chan string, 1)
			go func() { paid <- settleVia(payer.url, id, "pay", "buyer") }()

			a := waitAudit(t, sweeper, "paused", 15*time.Second, func(a lifecycleAudit) bool { return a.Expired == 1 })
			if !a.Consistent || a.Available != 1 || a.Held != 0 {
				t.Fatalf("after the sweep: %+v", a)
			}
			if err := payer.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if got := <-paid; !strings.HasPrefix(got, "409") || !strings.Contains(got, `"expired"`) {
				t.Errorf("the late pay answered %s, want 409 expired", got)
			}
			a = auditOf(t, sweeper, "paused")
			if !a.Consistent || a.Available != 1 || a.Paid != 0 || a.Expired != 1 || a.Returned != 1 {
				t.Errorf("after the late pay: %+v, want the unit back once and nothing paid", a)
			}
		})
	}
}

// placeHeld places one held order of one unit and returns its id.
func placeHeld(t *testing.T, base, sku, user string) string {
	t.Helper()
	resp, err := http.Post(base+"/orders", "application/json", strings.NewReader(fmt.Sprintf(`{"sku":%q,"quantity":1,"user_id":%q}`, sku, user)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated || !strings.Contains(string(raw), `"state":"held"`) {
		t.Fatalf("order: %d %s", resp.StatusCode, raw)
	}
	_, rest, _ := strings.Cut(string(raw), `"order_id":"`)
	id, _, _ := strings.Cut(rest, `"`)
	return id
}

// settleVia sends a pay or a cancel and returns "<status> <body>".
func settleVia(base, id, action, user string) string {
	resp, err := http.Post(base+"/orders/"+id+"/"+action, "application/json", strings.NewReader(fmt.Sprintf(`{"user_id":%q}`, user)))
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, raw)
}

// TestKillMidSweep: thousands of lapsed holds, one instance sweeping them
// in batches; it is frozen while a sweep transaction is open on the
// database and killed with SIGKILL. What its committed batches returned
// stays returned, the open batch returns nothing (its orders stay held),
// the books balance at once, and a new instance's sweep finishes the job:
// every unit back exactly once. PostgreSQL, whose pg_stat_activity shows
// the open transaction.
func TestKillMidSweep(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real service processes")
	}
	const holds = 3000
	dbURL := testdb.URL(t, "postgres")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db, err := store.Open(ctx, dbURL, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Holds that lapse at once: the sweep is what is under test here.
	placer := inventory.NewService(db, inventory.NewConditional(), inventory.WithHoldTTL(time.Millisecond), inventory.WithPerUserLimit(1))
	if err := placer.StartSale(ctx, "swept", holds); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, holds)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < holds; i += 16 {
				if _, err := placer.PlaceOrder(ctx, inventory.Request{SKU: "swept", Quantity: 1, UserID: fmt.Sprint("u-", i)}); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("placing the holds: %v", err)
	}

	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	openSweeps := func() int {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sweeper' AND xact_start IS NOT NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	sweeperURL := withAppName(t, dbURL, "sweeper")
	var killed bool
	for attempt := 0; attempt < 20 && !killed; attempt++ {
		sweeper := startInstance(t, "DATABASE_URL="+sweeperURL, "STRATEGY=conditional", "HOLD_SWEEP_EVERY=50ms")
		// Wait for a sweep transaction to be open, freeze the instance,
		// and kill it only if one is still open (else it committed in
		// between: let it go on and try again).
		deadline := time.Now().Add(10 * time.Second)
		for !killed && time.Now().Before(deadline) {
			if openSweeps() == 0 {
				time.Sleep(time.Millisecond) // polling the server's view of another process
				continue
			}
			if err := sweeper.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			waitStopped(t, sweeper.cmd.Process.Pid)
			if openSweeps() > 0 {
				if err := sweeper.cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				waitExited(sweeper)
				killed = true
				break
			}
			if err := sweeper.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		}
		if !killed {
			_ = sweeper.cmd.Process.Signal(syscall.SIGKILL)
			waitExited(sweeper)
		}
	}
	if !killed {
		t.Fatal("never caught a sweep transaction open")
	}
	// The server ends the dead instance's session and rolls its
	// transaction back; the books balance at every moment.
	mid, err := db.Audit(ctx, "swept")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the kill: %d expired, %d still held", mid.Expired, mid.Held)
	if !mid.Consistent() || mid.Held == 0 || mid.Expired+mid.Held != holds {
		t.Fatalf("after the kill mid-sweep: %+v, want the books balanced with holds left", mid)
	}

	next := startInstance(t, "DATABASE_URL="+dbURL, "STRATEGY=conditional", "HOLD_SWEEP_EVERY=100ms", "PER_USER_LIMIT=1")
	a := waitAudit(t, next, "swept", 30*time.Second, func(a lifecycleAudit) bool { return a.Held == 0 })
	if !a.Consistent || a.Expired != holds || a.Returned != holds || a.Available != holds {
		t.Fatalf("after the sweep finished: %+v, want every unit back once", a)
	}
	// The buyers' counts came back with the units: each may buy again.
	if status, err := postOrder(next.url, "swept", "u-0"); err != nil || status != http.StatusCreated {
		t.Errorf("a buyer whose hold expired orders again: %d %v", status, err)
	}
}

// waitExited waits for p to exit and leaves its exit for the test's
// cleanup, which waits for it too.
func waitExited(p *process) {
	err := <-p.exited
	p.exited <- err
}

// withAppName sets the PostgreSQL application_name of a DATABASE_URL, so
// that the server's views tell that instance's sessions apart.
func withAppName(t *testing.T, raw, name string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}
