package httpapi_test

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/lab/testdb"
)

// TestAdminWritesHonourIdempotencyKey: a restock and a sale's start sent
// twice with one Idempotency-Key apply once; the retry answers the first
// (replayed), the same key with another body is 422, and the audit lists
// the restock with its key.
func TestAdminWritesHonourIdempotencyKey(t *testing.T) {
	for _, engine := range []string{"postgres", "mysql"} {
		t.Run(engine, func(t *testing.T) {
			in := newInstance(t, testdb.New(t, engine, 4), sqlrow.NewConditional())
			admin := func(method, path, key, body string) reply {
				h := in.admin.Clone()
				h.Set("Content-Type", "application/json")
				if key != "" {
					h.Set("Idempotency-Key", key)
				}
				return call(t, method, in.url+path, h, body)
			}
			start := admin(http.MethodPut, "/admin/stock/s-1", "start-1", `{"available":10}`)
			if start.status != http.StatusOK || start.body["replayed"] != nil {
				t.Fatalf("start: %d %s", start.status, start.raw)
			}
			if o := in.order(t, `{"sku":"s-1","quantity":2,"user_id":"u"}`, nil); o.status != http.StatusCreated {
				t.Fatalf("order: %d %s", o.status, o.raw)
			}
			if again := admin(http.MethodPut, "/admin/stock/s-1", "start-1", `{"available":10}`); again.status != http.StatusOK || again.body["replayed"] != true {
				t.Errorf("the start's retry: %d %s, want 200 replayed", again.status, again.raw)
			}
			first := admin(http.MethodPost, "/admin/stock/s-1/restock", "restock-1", `{"quantity":5}`)
			if first.status != http.StatusOK || first.body["available"] != 13.0 || first.body["restock_id"] == "" || first.body["quantity"] != 5.0 {
				t.Fatalf("restock: %d %s", first.status, first.raw)
			}
			retry := admin(http.MethodPost, "/admin/stock/s-1/restock", "restock-1", `{"quantity":5}`)
			if retry.status != http.StatusOK || retry.body["replayed"] != true || retry.body["restock_id"] != first.body["restock_id"] || retry.body["available"] != 13.0 {
				t.Errorf("the restock's retry: %d %s, want the first replayed, 13 available", retry.status, retry.raw)
			}
			if other := admin(http.MethodPost, "/admin/stock/s-1/restock", "restock-1", `{"quantity":6}`); other.status != http.StatusUnprocessableEntity || other.errorCode(t) != "idempotency_conflict" {
				t.Errorf("the key with another quantity: %d %s, want 422", other.status, other.raw)
			}
			a := in.audit(t, "s-1")
			restocks, _ := a["restocks"].([]any)
			if a["restocked"] != 5.0 || a["orders"] != 1.0 || len(restocks) != 1 || restocks[0].(map[string]any)["idempotency_key"] != "restock-1" {
				t.Errorf("audit %v: want 5 restocked once, with its key, and the order kept", a)
			}
		})
	}
}

// TestBuyerListsTheirOrders: GET /orders?user_id=U lists the buyer's
// orders, oldest first, a page at a time, of one SKU with sku=, and no
// other buyer's; a held order's 201 carries expires_at, as its listing
// does.
func TestBuyerListsTheirOrders(t *testing.T) {
	for _, engine := range []string{"postgres", "mysql"} {
		t.Run(engine, func(t *testing.T) {
			in := newHoldingInstance(t, engine)
			in.startSale(t, "a", 10)
			in.startSale(t, "b", 10)
			var ids []string
			for _, sku := range []string{"a", "b", "a"} {
				o := in.order(t, `{"sku":"`+sku+`","quantity":1,"user_id":"u-1"}`, nil)
				if o.status != http.StatusCreated {
					t.Fatalf("order: %d %s", o.status, o.raw)
				}
				expires, err := time.Parse(time.RFC3339Nano, o.body["expires_at"].(string))
				if err != nil || time.Until(expires) < 59*time.Minute {
					t.Errorf("a held order's 201: expires_at %v (%v), want about an hour ahead", o.body["expires_at"], err)
				}
				ids = append(ids, o.body["order_id"].(string))
			}
			in.order(t, `{"sku":"a","quantity":1,"user_id":"u-2"}`, nil)
			list := func(query string) reply {
				r := call(t, http.MethodGet, in.url+"/orders?"+query, nil, "")
				if r.status != http.StatusOK {
					t.Fatalf("list %s: %d %s", query, r.status, r.raw)
				}
				return r
			}
			idsOf := func(r reply) []string {
				var out []string
				for _, o := range r.body["orders"].([]any) {
					out = append(out, o.(map[string]any)["order_id"].(string))
				}
				return out
			}
			all := list("user_id=u-1")
			if got := idsOf(all); len(got) != 3 || got[0] != ids[0] || got[1] != ids[1] || got[2] != ids[2] || all.body["next_after"] != nil {
				t.Errorf("u-1's orders: %v, want %v in order, one page", got, ids)
			}
			if got := idsOf(list("user_id=u-1&sku=a")); len(got) != 2 || got[0] != ids[0] || got[1] != ids[2] {
				t.Errorf("u-1's orders of a: %v", got)
			}
			page := list("user_id=u-1&limit=2")
			if got := idsOf(page); len(got) != 2 || page.body["next_after"] != ids[1] {
				t.Errorf("a page of 2: %v, next %v", got, page.body["next_after"])
			}
			if got := idsOf(list("user_id=u-1&limit=2&after=" + url.QueryEscape(ids[1]))); len(got) != 1 || got[0] != ids[2] {
				t.Errorf("the next page: %v", got)
			}
			if got := idsOf(list("user_id=nobody")); len(got) != 0 {
				t.Errorf("a buyer with no order: %v", got)
			}
			for _, bad := range []string{"", "user_id=", "user_id=u-1&limit=0", "user_id=u-1&limit=101", "user_id=u-1&after=x", "user_id=u-1&sku=", "user_id=u-1%20"} {
				if r := call(t, http.MethodGet, in.url+"/orders?"+bad, nil, ""); r.status != http.StatusBadRequest || r.errorCode(t) != "invalid_request" {
					t.Errorf("?%s: %d %s, want 400", bad, r.status, r.raw)
				}
			}
		})
	}
}
