package httpapi_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/httpapi"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/lab/testdb"
)

// TestGetOrderShowsItToItsBuyerOnly: GET /orders/{id}?user_id=U answers
// the order, state "final", to its buyer; another buyer, an unknown id and
// a malformed one learn nothing of it, and none of these reads changes the
// stock.
func TestGetOrderShowsItToItsBuyerOnly(t *testing.T) {
	for _, engine := range []string{"postgres", "mysql"} {
		t.Run(engine, func(t *testing.T) {
			in := newInstance(t, testdb.New(t, engine, 4), sqlrow.NewConditional())
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

// newHoldingInstance is an instance whose orders are held for an hour.
func newHoldingInstance(t *testing.T, engine string) *instance {
	t.Helper()
	db := testdb.New(t, engine, 4)
	svc := sales.NewService(db, sqlrow.NewConditional(), sales.WithHoldTTL(time.Hour))
	srv := httptest.NewServer(httpapi.New(svc, httpapi.WithAdminToken(adminToken)))
	t.Cleanup(srv.Close)
	return &instance{url: srv.URL, db: db, admin: http.Header{"Authorization": {"Bearer " + adminToken}}}
}

func (in *instance) settle(t *testing.T, id, action, body string) reply {
	t.Helper()
	return call(t, http.MethodPost, in.url+"/orders/"+url.PathEscape(id)+"/"+action, jsonHeader, body)
}

// TestPayAndCancelAHeldOrder walks the lifecycle's routes with HOLD_TTL
// set: a new order is held with its expires_at; pay and cancel answer 200
// with the order, again for a repeat, and 409 with the state that won for
// the other; the units of a cancelled order are for sale again, and the
// audit adds up.
func TestPayAndCancelAHeldOrder(t *testing.T) {
	for _, engine := range []string{"postgres", "mysql"} {
		t.Run(engine, func(t *testing.T) {
			in := newHoldingInstance(t, engine)
			in.startSale(t, "h-1", 5)
			placedAt := time.Now()
			place := func(user string, q int) string {
				r := in.order(t, fmt.Sprintf(`{"sku":"h-1","quantity":%d,"user_id":%q}`, q, user), nil)
				if r.status != http.StatusCreated || r.body["state"] != "held" {
					t.Fatalf("order: %d %s, want 201 held", r.status, r.raw)
				}
				return r.body["order_id"].(string)
			}
			paid, cancelled := place("payer", 2), place("canceller", 1)

			got := call(t, http.MethodGet, in.url+"/orders/"+paid+"?user_id=payer", nil, "")
			expires, err := time.Parse(time.RFC3339Nano, fmt.Sprint(got.body["expires_at"]))
			if got.status != http.StatusOK || got.body["state"] != "held" || err != nil {
				t.Fatalf("GET a held order: %d %s (%v)", got.status, got.raw, err)
			}
			// The database's clock set it; this machine's is the same one.
			if d := expires.Sub(placedAt); d < 59*time.Minute || d > 61*time.Minute {
				t.Errorf("expires_at %v is %v after the order, want HOLD_TTL (1h)", expires, d)
			}

			for _, c := range []struct {
				name, id, action, body string
				status                 int
				state, code            string
			}{
				{"pay", paid, "pay", `{"user_id":"payer"}`, 200, "paid", ""},
				{"pay again", paid, "pay", `{"user_id":"payer"}`, 200, "paid", ""},
				{"cancel after pay", paid, "cancel", `{"user_id":"payer"}`, 409, "", "paid"},
				{"cancel", cancelled, "cancel", `{"user_id":"canceller"}`, 200, "cancelled", ""},
				{"cancel again", cancelled, "cancel", `{"user_id":"canceller"}`, 200, "cancelled", ""},
				{"pay after cancel", cancelled, "pay", `{"user_id":"canceller"}`, 409, "", "cancelled"},
				{"another buyer", paid, "cancel", `{"user_id":"someone"}`, 404, "", "order_not_found"},
				{"unknown id", "00000000-0000-4000-8000-000000000000", "pay", `{"user_id":"payer"}`, 404, "", "order_not_found"},
				{"malformed id", "nope", "pay", `{"user_id":"payer"}`, 400, "", "invalid_request"},
				{"no user_id", paid, "pay", `{}`, 400, "", "invalid_request"},
				{"empty user_id", paid, "cancel", `{"user_id":""}`, 400, "", "invalid_request"},
				{"unknown field", paid, "cancel", `{"user_id":"payer","why":"x"}`, 400, "", "invalid_request"},
				{"not JSON", paid, "cancel", `user_id=payer`, 400, "", "invalid_request"},
			} {
				r := in.settle(t, c.id, c.action, c.body)
				switch {
				case r.status != c.status:
					t.Errorf("%s: %d %s, want %d", c.name, r.status, r.raw, c.status)
				case c.code != "" && r.errorCode(t) != c.code:
					t.Errorf("%s: %s, want code %s", c.name, r.raw, c.code)
				case c.state != "" && (r.body["state"] != c.state || r.body["order_id"] != c.id):
					t.Errorf("%s: %s, want the order in state %s", c.name, r.raw, c.state)
				}
			}
			a := in.audit(t, "h-1")
			want := map[string]float64{"initial": 5, "available": 3, "ordered": 2, "orders": 1, "held": 0, "paid": 2, "returned": 1, "cancelled": 1, "expired": 0}
			for k, v := range want {
				if a[k] != v {
					t.Errorf("audit %s = %v, want %v (%v)", k, a[k], v, a)
				}
			}
			if a["consistent"] != true {
				t.Errorf("audit not consistent: %v", a)
			}
			place("late", 3) // the cancelled unit is for sale again
			if got := in.available(t, "h-1"); got != 0 {
				t.Errorf("available %v after the returned unit sold, want 0", got)
			}
		})
	}
}

// TestFinalOrderRoutes: with HOLD_TTL=0 an order is final, and pay and
// cancel answer 409 final without changing anything.
func TestFinalOrderRoutes(t *testing.T) {
	in := newInstance(t, testdb.New(t, "postgres", 4), sqlrow.NewConditional())
	in.startSale(t, "f-1", 2)
	r := in.order(t, `{"sku":"f-1","quantity":1,"user_id":"u"}`, nil)
	if r.status != http.StatusCreated || r.body["state"] != "final" {
		t.Fatalf("order: %d %s", r.status, r.raw)
	}
	id := r.body["order_id"].(string)
	for _, action := range []string{"pay", "cancel"} {
		if r := in.settle(t, id, action, `{"user_id":"u"}`); r.status != http.StatusConflict || r.errorCode(t) != "final" {
			t.Errorf("%s of a final order: %d %s, want 409 final", action, r.status, r.raw)
		}
	}
	if got := in.available(t, "f-1"); got != 1 {
		t.Errorf("available %v, want 1", got)
	}
}

// TestRestockRoute: POST /admin/stock/{sku}/restock {"quantity": n} adds
// units to the sale in progress and keeps its orders; bad input and a SKU
// with no sale get a 4xx and change nothing.
func TestRestockRoute(t *testing.T) {
	in := newInstance(t, testdb.New(t, "mysql", 4), sqlrow.NewConditional())
	in.startSale(t, "r-1", 1)
	if r := in.order(t, `{"sku":"r-1","quantity":1,"user_id":"u"}`, nil); r.status != http.StatusCreated {
		t.Fatalf("order: %d %s", r.status, r.raw)
	}
	h := in.admin.Clone()
	h.Set("Content-Type", "application/json")
	restock := func(sku, body string) reply {
		return call(t, http.MethodPost, in.url+"/admin/stock/"+sku+"/restock", h, body)
	}
	if r := restock("r-1", `{"quantity":3}`); r.status != http.StatusOK || r.body["available"] != 3.0 {
		t.Fatalf("restock: %d %s", r.status, r.raw)
	}
	for _, c := range []struct {
		name, sku, body string
		status          int
		code            string
	}{
		{"no sale", "r-2", `{"quantity":3}`, 404, "unknown_sku"},
		{"zero", "r-1", `{"quantity":0}`, 400, "invalid_request"},
		{"negative", "r-1", `{"quantity":-2}`, 400, "invalid_request"},
		{"not an integer", "r-1", `{"quantity":1.5}`, 400, "invalid_request"},
		{"missing", "r-1", `{}`, 400, "invalid_request"},
		{"unknown field", "r-1", `{"quantity":1,"available":9}`, 400, "invalid_request"},
		{"bad sku", "r%20x", `{"quantity":1}`, 400, "invalid_request"},
	} {
		if r := restock(c.sku, c.body); r.status != c.status || r.errorCode(t) != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, r.status, r.raw, c.status, c.code)
		}
	}
	if r := call(t, http.MethodPost, in.url+"/admin/stock/r-1/restock", jsonHeader, `{"quantity":3}`); r.status != http.StatusUnauthorized {
		t.Errorf("restock without the token: %d", r.status)
	}
	a := in.audit(t, "r-1")
	if a["initial"] != 1.0 || a["restocked"] != 3.0 || a["available"] != 3.0 || a["ordered"] != 1.0 || a["consistent"] != true {
		t.Errorf("audit %v: want initial 1 + restocked 3 = available 3 + ordered 1", a)
	}
}

// TestSaleWindowRoute: PUT /admin/stock/{sku} takes optional starts_at and
// ends_at (RFC 3339); an order outside them is 409 not_started or ended
// with nothing changed, and a window that ends before it starts, or a time
// that is not RFC 3339, is 400 with no sale started.
func TestSaleWindowRoute(t *testing.T) {
	in := newInstance(t, testdb.New(t, "postgres", 4), sqlrow.NewForUpdate())
	h := in.admin.Clone()
	h.Set("Content-Type", "application/json")
	put := func(sku, body string) reply {
		return call(t, http.MethodPut, in.url+"/admin/stock/"+sku, h, body)
	}
	soon, ago := time.Now().Add(time.Hour).UTC().Format(time.RFC3339), time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	if r := put("later", `{"available":2,"starts_at":"`+soon+`"}`); r.status != http.StatusOK || r.body["starts_at"] == nil {
		t.Fatalf("start a sale with a window: %d %s", r.status, r.raw)
	}
	if r := put("over", `{"available":2,"ends_at":"`+ago+`"}`); r.status != http.StatusOK {
		t.Fatalf("start a sale that has ended: %d %s", r.status, r.raw)
	}
	for sku, code := range map[string]string{"later": "not_started", "over": "ended"} {
		r := in.order(t, `{"sku":"`+sku+`","quantity":1,"user_id":"u"}`, nil)
		if r.status != http.StatusConflict || r.errorCode(t) != code {
			t.Errorf("an order of %s: %d %s, want 409 %s", sku, r.status, r.raw, code)
		}
		if got := in.available(t, sku); got != 2 {
			t.Errorf("%s: available %v after a refused order, want 2", sku, got)
		}
	}
	for name, body := range map[string]string{
		"ends before it starts": `{"available":2,"starts_at":"` + soon + `","ends_at":"` + ago + `"}`,
		"not RFC 3339":          `{"available":2,"starts_at":"tomorrow"}`,
		"a number":              `{"available":2,"ends_at":1700000000}`,
	} {
		if r := put("bad", body); r.status != http.StatusBadRequest || r.errorCode(t) != "invalid_request" {
			t.Errorf("%s: %d %s, want 400", name, r.status, r.raw)
		}
	}
	if r := call(t, http.MethodGet, in.url+"/stock/bad", nil, ""); r.status != http.StatusNotFound {
		t.Errorf("a refused window started a sale: %d %s", r.status, r.raw)
	}
}
