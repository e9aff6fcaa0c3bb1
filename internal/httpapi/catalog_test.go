package httpapi_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/httpapi"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/lab/testdb"
)

// TestCatalogRoutePutsManySKUsOnSale: PUT /admin/stock takes an array of
// sales, needs the admin token, answers how many SKUs it put on sale (and
// replayed for a retry with the same key), and refuses a bad row with a
// 400 that names it, putting none of the request's SKUs on sale.
func TestCatalogRoutePutsManySKUsOnSale(t *testing.T) {
	for _, engine := range []string{"postgres", "mysql"} {
		t.Run(engine, func(t *testing.T) {
			in := newInstance(t, testdb.New(t, engine, 4), sqlrow.NewConditional())
			put := func(key, body string) reply {
				h := in.admin.Clone()
				h.Set("Content-Type", "application/json")
				if key != "" {
					h.Set("Idempotency-Key", key)
				}
				return call(t, http.MethodPut, in.url+"/admin/stock", h, body)
			}
			if r := call(t, http.MethodPut, in.url+"/admin/stock", jsonHeader, `[{"sku":"x","available":1}]`); r.status != http.StatusUnauthorized {
				t.Errorf("without the token: %d %s", r.status, r.raw)
			}
			later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
			body := `[{"sku":"k-1","available":3},{"sku":"k-2","available":5,"ends_at":"2999-01-01T00:00:00Z"},{"sku":"k-3","available":2,"starts_at":"` + later + `"}]`
			r := put("cat-1", body)
			if r.status != http.StatusOK || r.body["skus"] != 3.0 || r.body["replayed"] != nil {
				t.Fatalf("catalog: %d %s", r.status, r.raw)
			}
			if o := in.order(t, `{"sku":"k-2","quantity":2,"user_id":"u"}`, nil); o.status != http.StatusCreated {
				t.Fatalf("order: %d %s", o.status, o.raw)
			}
			if o := in.order(t, `{"sku":"k-3","quantity":1,"user_id":"u"}`, nil); o.status != http.StatusConflict || o.errorCode(t) != "not_started" {
				t.Errorf("an order before k-3's window: %d %s", o.status, o.raw)
			}
			if again := put("cat-1", body); again.status != http.StatusOK || again.body["replayed"] != true {
				t.Errorf("the retry: %d %s, want replayed", again.status, again.raw)
			}
			if got := in.available(t, "k-1"); got != 3 {
				t.Errorf("k-1 has %v units, want 3", got)
			}
			if got := in.available(t, "k-2"); got != 3 {
				t.Errorf("k-2 has %v units after an order of 2 and a retried start, want 3", got)
			}

			bad := []struct{ name, body, want string }{
				{"an object", `{"sku":"n-1","available":1}`, "JSON array"},
				{"a row's unknown field", `[{"sku":"n-1","available":1},{"sku":"n-2","available":1,"price":3}]`, "row 1"},
				{"a row without its SKU", `[{"sku":"n-1","available":1},{"available":1}]`, "row 1: sku is required"},
				{"a row's units as text", `[{"sku":"n-1","available":"4"}]`, `row 0 (sku "n-1"): available must be an integer`},
				{"a SKU twice", `[{"sku":"n-1","available":1},{"sku":"n-1","available":2}]`, `row 1 (sku "n-1")`},
				{"a bad SKU", `[{"sku":"n-1","available":1},{"sku":"n 2","available":2}]`, `row 1 (sku "n 2")`},
				{"a negative stock", `[{"sku":"n-1","available":-1}]`, `row 0 (sku "n-1"): available`},
				{"an empty array", `[]`, "names no SKU"},
				{"a bound past the year 9999 in UTC", `[{"sku":"n-1","available":1},{"sku":"n-2","available":1,"ends_at":"9999-12-31T23:30:00-01:00"}]`, `row 1 (sku "n-2"): ends_at must be in the years 1 to 9999`},
				{"a bound at the zero time", `[{"sku":"n-1","available":1,"ends_at":"0001-01-01T00:00:00Z"}]`, `row 0 (sku "n-1"): ends_at must be after 0001-01-01`},
				{"too many SKUs", "[" + strings.Repeat(`{"sku":"n-1","available":1},`, 10_000) + `{"sku":"n-1","available":1}]`, "more than 10000"},
				{"a body too large", "[" + strings.Repeat(" ", httpapi.MaxCatalogBodyBytes) + "]", "larger than"},
			}
			for _, b := range bad {
				r := put("", b.body)
				if r.status != http.StatusBadRequest || r.errorCode(t) != "invalid_request" {
					t.Errorf("%s: %d %s, want 400", b.name, r.status, truncated(r.raw))
					continue
				}
				if msg := r.body["error"].(map[string]any)["message"].(string); !strings.Contains(msg, b.want) {
					t.Errorf("%s: message %q does not say %q", b.name, msg, b.want)
				}
			}
			if r := call(t, http.MethodGet, in.url+"/stock/n-1", nil, ""); r.status != http.StatusNotFound {
				t.Errorf("n-1 was put on sale by a refused request: %d %s", r.status, r.raw)
			}
		})
	}
}

func truncated(s string) string {
	if len(s) > 200 {
		return fmt.Sprintf("%s… (%d bytes)", s[:200], len(s))
	}
	return s
}
