package main

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// soldOutTTL is the instances' SOLD_OUT_TTL in these tests: short, so that
// waiting it out (the expiry under test) costs little.
const soldOutTTL = 500 * time.Millisecond

// TestSoldOutMarkAcrossInstances: two instances of one sale. Each is told
// sold out, which marks the SKU on it (SOLD_OUT_TTL). A restock through the
// first lifts its own mark at once; the second, which did not see it, sells
// the restocked units to the first order sent once the bound has passed
// since its refusal. The same when the second is frozen (SIGSTOP) through
// the restock and past the bound: its mark runs on the monotonic clock,
// which a pause does not stop. Nothing is sold past the stock. Both
// engines.
func TestSoldOutMarkAcrossInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real service processes")
	}
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			url := testdb.URL(t, engine)
			env := []string{"DATABASE_URL=" + url, "STRATEGY=conditional", "SOLD_OUT_TTL=" + soldOutTTL.String()}
			a, b := startInstance(t, env...), startInstance(t, env...)
			adminJSON(t, http.MethodPut, a.url+"/admin/stock/marked", `{"available":1}`, nil)
			if code, err := postOrder(a.url, "marked", "u1"); code != http.StatusCreated {
				t.Fatalf("the only unit: %v", err)
			}
			soldOut := func(p *process, user string) {
				t.Helper()
				if code, err := postOrder(p.url, "marked", user); code != http.StatusConflict || !strings.Contains(err.Error(), "sold_out") {
					t.Fatalf("past the stock: %d %v, want 409 sold_out", code, err)
				}
			}
			soldOut(a, "u2")
			soldOut(b, "u3")

			// The instance's own restock lifts its mark at once.
			adminJSON(t, http.MethodPost, a.url+"/admin/stock/marked/restock", `{"quantity":1}`, nil)
			if code, err := postOrder(a.url, "marked", "u4"); code != http.StatusCreated {
				t.Fatalf("after its own restock, the instance refused: %v", err)
			}
			soldOut(a, "u5")

			// Another's restock reaches b once its bound has passed.
			adminJSON(t, http.MethodPost, a.url+"/admin/stock/marked/restock", `{"quantity":1}`, nil)
			time.Sleep(soldOutTTL) // the mark's expiry is what is under test
			if code, err := postOrder(b.url, "marked", "u6"); code != http.StatusCreated {
				t.Fatalf("past the bound since its refusal, b refused a restocked unit: %v", err)
			}
			soldOut(b, "u7")

			// Frozen through another's restock and past the bound.
			if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			waitStopped(t, b.cmd.Process.Pid)
			adminJSON(t, http.MethodPost, a.url+"/admin/stock/marked/restock", `{"quantity":1}`, nil)
			time.Sleep(soldOutTTL) // the mark's expiry is what is under test
			if err := b.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if code, err := postOrder(b.url, "marked", "u8"); code != http.StatusCreated {
				t.Fatalf("woken past the bound, b refused a restocked unit: %v", err)
			}
			soldOut(a, "u9")
			soldOut(b, "u10")

			var audit auditBody
			adminJSON(t, http.MethodGet, a.url+"/admin/audit/marked", "", &audit)
			if audit.Initial != 1 || audit.Orders != 4 || audit.Available != 0 {
				t.Errorf("audit %+v, want 4 orders of 1 unit + 3 restocked, none left", audit)
			}
		})
	}
}
