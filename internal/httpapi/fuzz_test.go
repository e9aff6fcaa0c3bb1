package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/flashsale/stock/internal/httpapi"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
)

// fuzzTarget is the service on a real database of one engine, with one
// strategy: fuzzed bytes that pass the checks reach its SQL.
type fuzzTarget struct {
	name    string // engine/strategy
	engine  string
	db      store.Store
	svc     *sales.Service
	handler http.Handler
}

// fuzzTargets starts the service on both engines with each of strategies
// (the services of one engine share its database), with s-1 on sale. A
// missing server skips the fuzz target, and fails it under CI=true
// (testdb).
func fuzzTargets(f *testing.F, stock int64, names []string, opts ...httpapi.Option) []fuzzTarget {
	f.Helper()
	var targets []fuzzTarget
	for _, engine := range store.Engines {
		db := testdb.New(f, engine, 4)
		for i, name := range names {
			// Built as the service builds it (batched takes its own path
			// from the handler to SQL: the whole order, in its batch's
			// transaction).
			cfg := strategies.Defaults()
			cfg.Strategy = name
			strategy, stop, err := strategies.Build(context.Background(), cfg, strategies.Deps{DB: db})
			if err != nil {
				f.Fatalf("%s: %v", name, err)
			}
			f.Cleanup(stop)
			svc := sales.NewService(db, strategy)
			if i == 0 {
				if err := svc.StartSale(context.Background(), "s-1", stock); err != nil {
					f.Fatalf("%s: %v", engine, err)
				}
			}
			targets = append(targets, fuzzTarget{name: engine + "/" + name, engine: engine, db: db, svc: svc, handler: httpapi.New(svc, opts...)})
		}
	}
	return targets
}

// checkAnswer fails on what no input may cause: a 5xx, a redirect, or an
// error that is not in the API's JSON shape.
func checkAnswer(t *testing.T, target string, rec *httptest.ResponseRecorder, input ...any) {
	t.Helper()
	if rec.Code >= 500 || rec.Code/100 == 3 {
		t.Fatalf("%s, input %q: status %d %s", target, input, rec.Code, rec.Body)
	}
	if rec.Code >= 400 {
		var body struct {
			Error struct {
				Code, Message string
			}
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error.Code == "" || body.Error.Message == "" {
			t.Fatalf("%s, input %q: status %d with a body not in the error shape: %s", target, input, rec.Code, rec.Body)
		}
	}
}

// FuzzPlaceOrder: on both engines and with both the conditional and the
// batched strategy (each input goes through all four), no body and no
// content type yields a 5xx, a request that is not accepted deducts
// nothing, and an accepted one is stored exactly as it was asked (its
// user_id read back byte for byte). On one engine the strategies answer an
// input alike: the same status (the stock, a billion units, does not run
// out here, so a sold-out cannot follow another strategy's 201).
func FuzzPlaceOrder(f *testing.F) {
	for _, seed := range []string{
		`{"sku":"s-1","quantity":1,"user_id":"u"}`,
		`{"sku":"s-1","quantity":1000,"user_id":"u"}`,
		`{"sku":"s-1","quantity":-5,"user_id":"u"}`,
		`{"sku":"s-1","quantity":1,"user_id":"u","x":[]}`,
		`{"sku":"` + strings.Repeat("a", 64) + `","quantity":1,"user_id":"u"}`,
		`{"sku":"s-1","quantity":1e309,"user_id":"u"}`,
		`{"sku":"s-1","quantity":1,"user_id":"\ud800"}`,
		`{"sku":"s-1","quantity":1,"user_id":"a\u0000b"}`,
		`{"sku":"s-1","quantity":1,"user_id":"😀` + strings.Repeat("é", 63) + `"}`,
		`{"SKU":"s-1","Quantity":1,"USER_ID":"x"}`,
		`{"sku":"s-1","quantity":1,"quantity":2,"user_id":"u"}`,
		`{"sku":"nope","quantity":1,"user_id":"u"}`,
		`{"sku":null}`, `[]`, `"x"`, `{`, ``, "\x00",
	} {
		f.Add(seed, "application/json")
	}
	f.Add(`{"sku":"s-1","quantity":1,"user_id":"u"}`, "text/plain")

	targets := fuzzTargets(f, inventory.MaxInitialStock, []string{strategies.NameConditional, strategies.NameBatched})
	f.Fuzz(func(t *testing.T, body, contentType string) {
		ctx := context.Background()
		first := map[string]fuzzTarget{} // by engine: its first target
		status := map[string]int{}       // and that target's status
		for _, tg := range targets {
			before, err := tg.svc.Audit(ctx, "s-1")
			if err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewReader([]byte(body)))
			req.Header.Set("Content-Type", contentType)
			rec := httptest.NewRecorder()
			tg.handler.ServeHTTP(rec, req)
			checkAnswer(t, tg.name, rec, body, contentType)
			if prior, ok := first[tg.engine]; !ok {
				first[tg.engine], status[tg.engine] = tg, rec.Code
			} else if rec.Code != status[tg.engine] {
				t.Fatalf("%s, input %q: status %d, but %s answered %d", tg.name, body, rec.Code, prior.name, status[tg.engine])
			}
			after, err := tg.svc.Audit(ctx, "s-1")
			if err != nil {
				t.Fatal(err)
			}
			if !after.Consistent() {
				t.Fatalf("%s: stock not conserved: %+v", tg.name, after)
			}
			if rec.Code != http.StatusCreated {
				if !reflect.DeepEqual(after, before) {
					t.Fatalf("%s: answer %d changed the stock: %+v -> %+v", tg.name, rec.Code, before, after)
				}
				continue
			}
			var answer struct {
				OrderID string `json:"order_id"`
				SKU     string `json:"sku"`
				UserID  string `json:"user_id"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &answer); err != nil {
				t.Fatalf("%s: 201 body %s: %v", tg.name, rec.Body, err)
			}
			// What was accepted names its fields exactly as the contract
			// does: not "SKU", not "User_Id".
			var sent map[string]any
			if err := json.Unmarshal([]byte(body), &sent); err != nil {
				t.Fatalf("%s: 201 for a body that is not a JSON object: %q", tg.name, body)
			}
			if _, ok := sent["sku"]; !ok || len(sent) != 3 || sent["user_id"] != answer.UserID || sent["sku"] != answer.SKU {
				t.Fatalf("%s: 201 for %q, which does not name sku, quantity and user_id exactly", tg.name, body)
			}
			stored, found, err := tg.db.FindOrder(ctx, answer.OrderID)
			if err != nil || !found {
				t.Fatalf("%s: the order of a 201 is not in the database: found %v, %v", tg.name, found, err)
			}
			if stored.UserID != answer.UserID || stored.SKU != answer.SKU {
				t.Fatalf("%s: stored %q/%q, answered %q/%q", tg.name, stored.SKU, stored.UserID, answer.SKU, answer.UserID)
			}
		}
	})
}

// FuzzStartSale: on both engines, the admin handler never answers 5xx
// either, and a refused request leaves the sale as it was.
func FuzzStartSale(f *testing.F) {
	for _, seed := range []struct{ sku, body string }{
		{"s-1", `{"available":5}`},
		{"s-1", `{"available":-1}`},
		{"s-1", `{"available":1e3}`},
		{"s-1", `{"available":"5"}`},
		{"s-1", `{"available":5,"x":1}`},
		{"s-1", `{"Available":5}`},
		{"s-1", `{"available":5,"available":6}`},
		{"s-1/", `{"available":5}`},
		{"", `{"available":5}`},
		{"s%201", `{"available":5}`},
		{"s%00", `{"available":5}`},
		{strings.Repeat("a", 65), `{"available":5}`},
		{"s-1", `{"available":99999999999999999999}`},
		{"s-1", `[]`},
	} {
		f.Add(seed.sku, seed.body)
	}
	const stock = 3
	targets := fuzzTargets(f, stock, []string{strategies.NameConditional}, httpapi.WithAdminToken(adminToken))
	f.Fuzz(func(t *testing.T, sku, body string) {
		ctx := context.Background()
		for _, tg := range targets {
			before, err := tg.svc.Audit(ctx, "s-1")
			if err != nil {
				t.Fatal(err)
			}
			req, err := http.NewRequest(http.MethodPut, "/admin/stock/"+sku, strings.NewReader(body))
			if err != nil {
				return // not a request a client could send
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+adminToken)
			rec := httptest.NewRecorder()
			tg.handler.ServeHTTP(rec, req)
			checkAnswer(t, tg.name, rec, sku, body)
			after, err := tg.svc.Audit(ctx, "s-1")
			if err != nil {
				t.Fatal(err)
			}
			if rec.Code != http.StatusOK && !reflect.DeepEqual(after, before) {
				t.Fatalf("%s: answer %d changed s-1: %+v -> %+v", tg.name, rec.Code, before, after)
			}
			if rec.Code == http.StatusOK && !reflect.DeepEqual(after, before) {
				// A fuzzed request that started the sale of s-1 anew: put it
				// back for the next input.
				if err := tg.svc.StartSale(ctx, "s-1", stock); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}
