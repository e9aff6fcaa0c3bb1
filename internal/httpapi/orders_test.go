package httpapi_test

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/testdb"
)

// TestGetOrderShowsItToItsBuyerOnly: GET /orders/{id}?user_id=U answers
// the order, state "final", to its buyer; another buyer, an unknown id and
// a malformed one learn nothing of it, and none of these reads changes the
// stock.
func TestGetOrderShowsItToItsBuyerOnly(t *testing.T) {
	for _, engine := range []string{"postgres", "mysql"} {
		t.Run(engine, func(t *testing.T) {
			in := newInstance(t, testdb.New(t, engine, 4), inventory.NewConditional())
			in.startSale(t, "s-1", 5)
			placed := in.order(t, `{"sku":"s-1","quantity":2,"user_id":"u-é"}`, nil)
			if placed.status != http.StatusCreated {
				t.Fatalf("order: %d %s", placed.status, placed.raw)
			}
			id := placed.body["order_id"].(string)
			get := func(id, query string) reply {
				return call(t, http.MethodGet, in.url+"/orders/"+url.PathEscape(id)+query, nil, "")
			}

			r := get(id, "?user_id="+url.QueryEscape("u-é"))
			if r.status != http.StatusOK {
				t.Fatalf("the buyer's GET: %d %s", r.status, r.raw)
			}
			want := map[string]any{"order_id": id, "sku": "s-1", "quantity": 2.0, "user_id": "u-é", "strategy": "conditional", "state": "final"}
			for k, v := range want {
				if r.body[k] != v {
					t.Errorf("%s = %v, want %v", k, r.body[k], v)
				}
			}
			if len(r.body) != len(want) {
				t.Errorf("body %s: want exactly %d fields", r.raw, len(want))
			}

			for _, c := range []struct {
				name, id, query string
				status          int
				code            string
			}{
				{"another buyer", id, "?user_id=u-2", http.StatusNotFound, "order_not_found"},
				{"unknown id", "00000000-0000-4000-8000-000000000000", "?user_id=u-é", http.StatusNotFound, "order_not_found"},
				{"malformed id", "not-a-uuid", "?user_id=u-é", http.StatusBadRequest, "invalid_request"},
				{"no user_id", id, "", http.StatusBadRequest, "invalid_request"},
				{"empty user_id", id, "?user_id=", http.StatusBadRequest, "invalid_request"},
			} {
				r := get(c.id, c.query)
				if r.status != c.status || r.errorCode(t) != c.code {
					t.Errorf("%s: %d %s, want %d %s", c.name, r.status, r.raw, c.status, c.code)
				}
			}
			if got := in.available(t, "s-1"); got != 3 {
				t.Errorf("available %v after one order of 2 of 5 and the reads, want 3", got)
			}
		})
	}
}
