package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/httpapi"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
)

const adminToken = "test-admin-token"

// instance is one running copy of the service.
type instance struct {
	url   string
	db    store.Store
	admin http.Header
}

// newInstance starts the service on db, over a real HTTP listener on
// 127.0.0.1.
func newInstance(t *testing.T, db store.Store, strategy inventory.Strategic, opts ...httpapi.Option) *instance {
	t.Helper()
	svc := sales.NewService(db, strategy)
	srv := httptest.NewServer(httpapi.New(svc, append([]httpapi.Option{httpapi.WithAdminToken(adminToken)}, opts...)...))
	t.Cleanup(srv.Close)
	return &instance{url: srv.URL, db: db, admin: http.Header{"Authorization": {"Bearer " + adminToken}}}
}

// reply is an HTTP answer with its JSON body decoded.
type reply struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

// errorCode returns error.code of an error body, failing the test when the
// body does not have the shape every error shares.
func (r reply) errorCode(t *testing.T) string {
	t.Helper()
	e, ok := r.body["error"].(map[string]any)
	if !ok || len(r.body) != 1 {
		t.Fatalf("status %d: error body %s is not {\"error\":{…}}", r.status, r.raw)
	}
	code, _ := e["code"].(string)
	msg, _ := e["message"].(string)
	if code == "" || msg == "" || len(e) != 2 {
		t.Fatalf("status %d: error body %s lacks code or message", r.status, r.raw)
	}
	return code
}

// send makes one request; it is safe to call from any goroutine.
func send(method, url string, header http.Header, body string) (reply, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	r := reply{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			return r, fmt.Errorf("%s %s: answer is not a JSON object: %q", method, url, raw)
		}
	}
	return r, nil
}

func call(t *testing.T, method, url string, header http.Header, body string) reply {
	t.Helper()
	r, err := send(method, url, header, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var jsonHeader = http.Header{"Content-Type": {"application/json"}}

func (in *instance) order(t *testing.T, body string, header http.Header) reply {
	t.Helper()
	h := jsonHeader.Clone()
	for k, v := range header {
		h[k] = v
	}
	return call(t, http.MethodPost, in.url+"/orders", h, body)
}

func (in *instance) startSale(t *testing.T, sku string, n int) {
	t.Helper()
	h := in.admin.Clone()
	h.Set("Content-Type", "application/json")
	r := call(t, http.MethodPut, in.url+"/admin/stock/"+sku, h, fmt.Sprintf(`{"available":%d}`, n))
	if r.status != http.StatusOK {
		t.Fatalf("start sale %s: %d %s", sku, r.status, r.raw)
	}
}

func (in *instance) audit(t *testing.T, sku string) map[string]any {
	t.Helper()
	r := call(t, http.MethodGet, in.url+"/admin/audit/"+sku, in.admin, "")
	if r.status != http.StatusOK {
		t.Fatalf("audit %s: %d %s", sku, r.status, r.raw)
	}
	return r.body
}

func (in *instance) available(t *testing.T, sku string) float64 {
	t.Helper()
	r := call(t, http.MethodGet, in.url+"/stock/"+sku, nil, "")
	if r.status != http.StatusOK {
		t.Fatalf("stock %s: %d %s", sku, r.status, r.raw)
	}
	return r.body["available"].(float64)
}

func TestPlaceOrder(t *testing.T) {
	in := newInstance(t, testdb.New(t, "postgres", 4), sqlrow.NewForUpdate())
	in.startSale(t, "s-1", 10)

	r := in.order(t, `{"sku":"s-1","quantity":2,"user_id":"u-9"}`, nil)
	if r.status != http.StatusCreated {
		t.Fatalf("status %d %s, want 201", r.status, r.raw)
	}
	want := map[string]any{"sku": "s-1", "quantity": 2.0, "user_id": "u-9", "strategy": "for-update", "state": "final"}
	for k, v := range want {
		if r.body[k] != v {
			t.Errorf("%s = %v, want %v", k, r.body[k], v)
		}
	}
	if id, _ := r.body["order_id"].(string); id == "" || len(r.body) != 6 {
		t.Errorf("body %s: want order_id and exactly the six fields", r.raw)
	}
	if got := in.available(t, "s-1"); got != 8 {
		t.Errorf("available %v after buying 2 of 10", got)
	}
	// A charset parameter is still JSON.
	r = in.order(t, `{"sku":"s-1","quantity":1,"user_id":"u-9"}`, http.Header{"Content-Type": {"application/json; charset=utf-8"}})
	if r.status != http.StatusCreated {
		t.Errorf("with charset: status %d %s", r.status, r.raw)
	}
	// 64 characters is the limit, counted in characters, not bytes.
	r = in.order(t, `{"sku":"s-1","quantity":1,"user_id":"`+strings.Repeat("é", 64)+`"}`, nil)
	if r.status != http.StatusCreated {
		t.Errorf("64-character user_id: status %d %s", r.status, r.raw)
	}
	if got := in.available(t, "s-1"); got != 6 {
		t.Errorf("available %v, want 6", got)
	}
}

// TestBadOrdersChangeNothing walks every 4xx cause of the contract and checks
// that none of them deducts anything.
func TestBadOrdersChangeNothing(t *testing.T) {
	in := newInstance(t, testdb.New(t, "postgres", 4), sqlrow.NewConditional())
	in.startSale(t, "s-1", 5)
	in.startSale(t, "small", 1)

	huge := `{"sku":"s-1","quantity":1,"user_id":"u"` + strings.Repeat(" ", httpapi.MaxBodyBytes) + `}`
	cases := []struct {
		name   string
		body   string
		header http.Header
		status int
		code   string
	}{
		{"malformed JSON", `{"sku":"s-1",`, nil, 400, "invalid_request"},
		{"not JSON at all", `sku=s-1`, nil, 400, "invalid_request"},
		{"empty body", ``, nil, 400, "invalid_request"},
		{"array body", `[{"sku":"s-1","quantity":1,"user_id":"u"}]`, nil, 400, "invalid_request"},
		{"null body", `null`, nil, 400, "invalid_request"},
		{"unknown field", `{"sku":"s-1","quantity":1,"user_id":"u","price":1}`, nil, 400, "invalid_request"},
		{"field names in capitals", `{"SKU":"s-1","Quantity":1,"USER_ID":"x"}`, nil, 400, "invalid_request"},
		{"one field name in another case", `{"sku":"s-1","quantity":1,"User_Id":"x"}`, nil, 400, "invalid_request"},
		{"field name with a Kelvin sign", `{"s\u212aU":"s-1","sku":"s-1","quantity":1,"user_id":"x"}`, nil, 400, "invalid_request"},
		{"repeated quantity", `{"sku":"s-1","quantity":1,"quantity":2,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"repeated sku", `{"sku":"nope","sku":"s-1","quantity":1,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"repeated user_id, escaped", `{"sku":"s-1","quantity":1,"user_id":"u","user\u005fid":"v"}`, nil, 400, "invalid_request"},
		{"trailing data", `{"sku":"s-1","quantity":1,"user_id":"u"} {}`, nil, 400, "invalid_request"},
		{"body over 64 KiB", huge, nil, 400, "invalid_request"},
		{"missing sku", `{"quantity":1,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"missing quantity", `{"sku":"s-1","user_id":"u"}`, nil, 400, "invalid_request"},
		{"missing user_id", `{"sku":"s-1","quantity":1}`, nil, 400, "invalid_request"},
		{"empty sku", `{"sku":"","quantity":1,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"sku of 65 characters", `{"sku":"` + strings.Repeat("a", 65) + `","quantity":1,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"sku with a space", `{"sku":"s 1","quantity":1,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"sku with a slash", `{"sku":"s/1","quantity":1,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"sku not ASCII", `{"sku":"s-é","quantity":1,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"sku a number", `{"sku":1,"quantity":1,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"user_id with NUL", `{"sku":"s-1","quantity":1,"user_id":"a\u0000b"}`, nil, 400, "invalid_request"},
		{"user_id with a newline", `{"sku":"s-1","quantity":1,"user_id":"a\nb"}`, nil, 400, "invalid_request"},
		{"user_id with ESC", `{"sku":"s-1","quantity":1,"user_id":"\u001b[31m"}`, nil, 400, "invalid_request"},
		{"user_id with DEL", `{"sku":"s-1","quantity":1,"user_id":"a\u007fb"}`, nil, 400, "invalid_request"},
		{"user_id with a C1 control", `{"sku":"s-1","quantity":1,"user_id":"a\u0085b"}`, nil, 400, "invalid_request"},
		{"user_id with a bidi override", `{"sku":"s-1","quantity":1,"user_id":"a\u202eb"}`, nil, 400, "invalid_request"},
		{"empty user_id", `{"sku":"s-1","quantity":1,"user_id":""}`, nil, 400, "invalid_request"},
		{"user_id a number", `{"sku":"s-1","quantity":1,"user_id":7}`, nil, 400, "invalid_request"},
		{"user_id of 65 characters", `{"sku":"s-1","quantity":1,"user_id":"` + strings.Repeat("u", 65) + `"}`, nil, 400, "invalid_request"},
		{"quantity 0", `{"sku":"s-1","quantity":0,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"quantity -1", `{"sku":"s-1","quantity":-1,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"quantity 1001", `{"sku":"s-1","quantity":1001,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"quantity 2.5", `{"sku":"s-1","quantity":2.5,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"quantity 1.0", `{"sku":"s-1","quantity":1.0,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"quantity 1e0", `{"sku":"s-1","quantity":1e0,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"quantity as a string", `{"sku":"s-1","quantity":"1","user_id":"u"}`, nil, 400, "invalid_request"},
		{"quantity null", `{"sku":"s-1","quantity":null,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"quantity huge", `{"sku":"s-1","quantity":99999999999999999999,"user_id":"u"}`, nil, 400, "invalid_request"},
		{"idempotency key too long", `{"sku":"s-1","quantity":1,"user_id":"u"}`, http.Header{"Idempotency-Key": {strings.Repeat("k", 256)}}, 400, "invalid_request"},
		{"idempotency key with a space", `{"sku":"s-1","quantity":1,"user_id":"u"}`, http.Header{"Idempotency-Key": {"a b"}}, 400, "invalid_request"},
		{"text/plain", `{"sku":"s-1","quantity":1,"user_id":"u"}`, http.Header{"Content-Type": {"text/plain"}}, 415, "unsupported_media_type"},
		{"no content type", `{"sku":"s-1","quantity":1,"user_id":"u"}`, http.Header{"Content-Type": nil}, 415, "unsupported_media_type"},
		{"form", `sku=s-1`, http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, 415, "unsupported_media_type"},
		{"unknown sku", `{"sku":"nope","quantity":1,"user_id":"u"}`, nil, 404, "unknown_sku"},
		{"sold out", `{"sku":"small","quantity":2,"user_id":"u"}`, nil, 409, "sold_out"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := in.order(t, c.body, c.header)
			if r.status != c.status {
				t.Fatalf("status %d %s, want %d", r.status, r.raw, c.status)
			}
			if code := r.errorCode(t); code != c.code {
				t.Errorf("code %q, want %q", code, c.code)
			}
		})
	}
	for sku, n := range map[string]float64{"s-1": 5, "small": 1} {
		a := in.audit(t, sku)
		if a["available"] != n || a["orders"] != 0.0 || a["consistent"] != true {
			t.Errorf("after bad requests only, audit of %s is %v", sku, a)
		}
	}
}

func TestIdempotencyKey(t *testing.T) {
	in := newInstance(t, testdb.New(t, "postgres", 4), sqlrow.NewConditional())
	in.startSale(t, "s-1", 10)
	key := http.Header{"Idempotency-Key": {"key-1"}}

	first := in.order(t, `{"sku":"s-1","quantity":3,"user_id":"u-1"}`, key)
	again := in.order(t, `{"sku":"s-1","quantity":3,"user_id":"u-1"}`, key)
	if first.status != 201 || again.status != 201 {
		t.Fatalf("statuses %d and %d, want 201 twice", first.status, again.status)
	}
	if first.raw != again.raw {
		t.Errorf("a retry answered %s, the first request %s", again.raw, first.raw)
	}
	other := in.order(t, `{"sku":"s-1","quantity":4,"user_id":"u-1"}`, key)
	if other.status != http.StatusUnprocessableEntity || other.errorCode(t) != "idempotency_conflict" {
		t.Errorf("reused key with another body: %d %s, want 422 idempotency_conflict", other.status, other.raw)
	}
	if got := in.available(t, "s-1"); got != 7 {
		t.Errorf("available %v, want 7: one deduction of 3", got)
	}
	// A new sale forgets the keys of the old one.
	in.startSale(t, "s-1", 10)
	if r := in.order(t, `{"sku":"s-1","quantity":4,"user_id":"u-1"}`, key); r.status != 201 {
		t.Errorf("after a new sale the key is free again, got %d %s", r.status, r.raw)
	}
}

// TestIdempotencyAcrossInstances: concurrent retries of one key, spread over
// two instances with pools of their own, deduct once, with for-update (one
// transaction per order) and batched (several retries in one batch).
func TestIdempotencyAcrossInstances(t *testing.T) {
	for _, engine := range store.Engines {
		for _, strategy := range []string{strategies.NameForUpdate, strategies.NameBatched} {
			t.Run(engine+"/"+strategy, func(t *testing.T) {
				t.Parallel()
				url := testdb.URL(t, engine)
				var instances []*instance
				for range 2 {
					db, err := store.Open(context.Background(), url, 8)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(db.Close)
					if err := db.Migrate(context.Background()); err != nil {
						t.Fatal(err)
					}
					var s inventory.Strategic = sqlrow.NewForUpdate()
					if strategy == strategies.NameBatched {
						s = batched.New(db)
					}
					instances = append(instances, newInstance(t, db, s))
				}
				instances[0].startSale(t, "s-1", 100)

				const retries = 24
				replies := make([]reply, retries)
				errs := make([]error, retries)
				var wg sync.WaitGroup
				start := make(chan struct{})
				for i := range retries {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						h := http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {"same-key"}}
						replies[i], errs[i] = send(http.MethodPost, instances[i%2].url+"/orders", h, `{"sku":"s-1","quantity":2,"user_id":"u-1"}`)
					}()
				}
				close(start)
				wg.Wait()

				ids := map[any]int{}
				for i, r := range replies {
					if errs[i] != nil {
						t.Errorf("retry %d: %v", i, errs[i])
						continue
					}
					if r.status != http.StatusCreated {
						t.Errorf("a retry got %d %s", r.status, r.raw)
						continue
					}
					ids[r.body["order_id"]]++
				}
				if len(ids) != 1 {
					t.Errorf("%d different order ids for one key: %v", len(ids), ids)
				}
				a := instances[1].audit(t, "s-1")
				if a["orders"] != 1.0 || a["available"] != 98.0 || a["consistent"] != true {
					t.Errorf("audit %v: want one order of 2", a)
				}
			})
		}
	}
}

func TestAdminRoutes(t *testing.T) {
	db := testdb.New(t, "postgres", 4)
	in := newInstance(t, db, sqlrow.NewConditional())
	body := `{"available":7}`

	t.Run("no token configured", func(t *testing.T) {
		closed := newInstance(t, db, sqlrow.NewConditional(), httpapi.WithAdminToken(""))
		for _, h := range []http.Header{nil, in.admin} {
			h = h.Clone()
			if h == nil {
				h = http.Header{}
			}
			h.Set("Content-Type", "application/json")
			r := call(t, http.MethodPut, closed.url+"/admin/stock/s-1", h, body)
			if r.status != http.StatusForbidden || r.errorCode(t) != "forbidden" {
				t.Errorf("PUT without ADMIN_TOKEN: %d %s, want 403", r.status, r.raw)
			}
			if r := call(t, http.MethodGet, closed.url+"/admin/audit/s-1", h, ""); r.status != http.StatusForbidden {
				t.Errorf("GET audit without ADMIN_TOKEN: %d, want 403", r.status)
			}
		}
	})
	t.Run("missing or wrong token", func(t *testing.T) {
		for _, auth := range []string{"", "Bearer wrong", "Basic " + adminToken, adminToken, "Bearer " + adminToken + "x"} {
			h := http.Header{"Content-Type": {"application/json"}}
			if auth != "" {
				h.Set("Authorization", auth)
			}
			r := call(t, http.MethodPut, in.url+"/admin/stock/s-1", h, body)
			if r.status != http.StatusUnauthorized || r.errorCode(t) != "unauthorized" {
				t.Errorf("Authorization %q: %d %s, want 401", auth, r.status, r.raw)
			}
		}
		if r := call(t, http.MethodGet, in.url+"/stock/s-1", nil, ""); r.status != http.StatusNotFound {
			t.Errorf("a refused PUT created the SKU: GET /stock answered %d", r.status)
		}
	})
	t.Run("start a sale and audit it", func(t *testing.T) {
		in.startSale(t, "s-1", 7)
		if r := in.order(t, `{"sku":"s-1","quantity":3,"user_id":"u"}`, nil); r.status != 201 {
			t.Fatalf("order: %d %s", r.status, r.raw)
		}
		a := in.audit(t, "s-1")
		want := map[string]any{"sku": "s-1", "initial": 7.0, "available": 4.0, "ordered": 3.0, "orders": 1.0, "consistent": true}
		for k, v := range want {
			if a[k] != v {
				t.Errorf("audit %s = %v, want %v", k, a[k], v)
			}
		}
		// Starting the sale again resets stock and forgets the orders.
		in.startSale(t, "s-1", 2)
		a = in.audit(t, "s-1")
		if a["initial"] != 2.0 || a["available"] != 2.0 || a["orders"] != 0.0 || a["ordered"] != 0.0 {
			t.Errorf("after a new sale the audit is %v", a)
		}
	})
	t.Run("bad admin input", func(t *testing.T) {
		h := in.admin.Clone()
		h.Set("Content-Type", "application/json")
		for _, c := range []struct {
			path, body string
			status     int
		}{
			{"/admin/stock/s-1", `{"available":-1}`, 400},
			{"/admin/stock/s-1", `{"available":1.5}`, 400},
			{"/admin/stock/s-1", `{"available":"3"}`, 400},
			{"/admin/stock/s-1", `{}`, 400},
			{"/admin/stock/s-1", `{"available":3,"x":1}`, 400},
			{"/admin/stock/s-1", `{"Available":3}`, 400},
			{"/admin/stock/s-1", `{"AVAILABLE":3}`, 400},
			{"/admin/stock/s-1", `{"available":3,"available":4}`, 400},
			{"/admin/stock/s-1", `{"available":1000000001}`, 400},
			{"/admin/stock/" + strings.Repeat("a", 65), `{"available":3}`, 400},
			{"/admin/stock/s%201", `{"available":3}`, 400},
		} {
			r := call(t, http.MethodPut, in.url+c.path, h, c.body)
			if r.status != c.status {
				t.Errorf("PUT %s %s: %d %s, want %d", c.path, c.body, r.status, r.raw, c.status)
			}
			r.errorCode(t)
		}
		if r := call(t, http.MethodPut, in.url+"/admin/stock/s-1", in.admin, body); r.status != http.StatusUnsupportedMediaType {
			t.Errorf("PUT without JSON content type: %d, want 415", r.status)
		}
		if r := call(t, http.MethodGet, in.url+"/admin/audit/nope", in.admin, ""); r.status != http.StatusNotFound || r.errorCode(t) != "unknown_sku" {
			t.Errorf("audit of an unknown SKU: %d %s", r.status, r.raw)
		}
		if got := in.available(t, "s-1"); got != 2 {
			t.Errorf("bad admin input changed the stock to %v", got)
		}
	})
}

func TestStockAndProbes(t *testing.T) {
	db := testdb.New(t, "mysql", 4)
	in := newInstance(t, db, sqlrow.NewConditional())
	in.startSale(t, "s-1", 37)
	r := call(t, http.MethodGet, in.url+"/stock/s-1", nil, "")
	if r.status != 200 || r.body["sku"] != "s-1" || r.body["available"] != 37.0 || len(r.body) != 2 {
		t.Errorf("GET /stock/s-1: %d %s", r.status, r.raw)
	}
	if r := call(t, http.MethodGet, in.url+"/stock/nope", nil, ""); r.status != 404 || r.errorCode(t) != "unknown_sku" {
		t.Errorf("GET /stock/nope: %d %s", r.status, r.raw)
	}
	if r := call(t, http.MethodGet, in.url+"/stock/s%201", nil, ""); r.status != 400 || r.errorCode(t) != "invalid_request" {
		t.Errorf("GET /stock/s%%201: %d %s", r.status, r.raw)
	}
	if r := call(t, http.MethodGet, in.url+"/nowhere", nil, ""); r.status != 404 || r.errorCode(t) != "not_found" {
		t.Errorf("unknown route: %d %s", r.status, r.raw)
	}
	if r := call(t, http.MethodDelete, in.url+"/orders", nil, ""); r.status != 405 || r.errorCode(t) != "method_not_allowed" {
		t.Errorf("DELETE /orders: %d %s", r.status, r.raw)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if r := call(t, http.MethodGet, in.url+path, nil, ""); r.status != 200 {
			t.Errorf("%s: %d %s", path, r.status, r.raw)
		}
	}
}

// TestBackendDown: with the database gone, orders get 503 with Retry-After,
// readiness fails, and liveness does not.
func TestBackendDown(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, engine, 4)
			in := newInstance(t, db, sqlrow.NewForUpdate())
			in.startSale(t, "s-1", 5)
			db.Close()

			r := in.order(t, `{"sku":"s-1","quantity":1,"user_id":"u"}`, nil)
			if r.status != http.StatusServiceUnavailable || r.errorCode(t) != "unavailable" || r.header.Get("Retry-After") == "" {
				t.Errorf("order with the database closed: %d %s (Retry-After %q)", r.status, r.raw, r.header.Get("Retry-After"))
			}
			if r := call(t, http.MethodGet, in.url+"/readyz", nil, ""); r.status != http.StatusServiceUnavailable {
				t.Errorf("/readyz with the database closed: %d", r.status)
			}
			if r := call(t, http.MethodGet, in.url+"/healthz", nil, ""); r.status != http.StatusOK {
				t.Errorf("/healthz with the database closed: %d", r.status)
			}
		})
	}
}
