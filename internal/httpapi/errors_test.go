package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/flashsale/stock/internal/httpapi"
	"github.com/flashsale/stock/internal/inventory"
)

// failingInventory answers every order with one error: a small fake to walk
// the error table without staging each failure on a real database.
type failingInventory struct {
	err error
}

var _ httpapi.Inventory = failingInventory{}

func (f failingInventory) PlaceOrder(context.Context, inventory.Request) (inventory.Order, error) {
	return inventory.Order{}, f.err
}
func (f failingInventory) Level(context.Context, string) (inventory.Level, error) {
	return inventory.Level{}, f.err
}
func (f failingInventory) OpenSale(context.Context, inventory.SaleRequest) (inventory.SaleStarted, error) {
	return inventory.SaleStarted{}, f.err
}
func (f failingInventory) OpenCatalog(context.Context, inventory.CatalogRequest) (inventory.CatalogStarted, error) {
	return inventory.CatalogStarted{}, f.err
}
func (f failingInventory) Audit(context.Context, string) (inventory.Audit, error) {
	return inventory.Audit{}, f.err
}
func (f failingInventory) Ready(context.Context) error { return f.err }
func (f failingInventory) FindOrder(context.Context, string, string) (inventory.Order, error) {
	return inventory.Order{}, f.err
}
func (f failingInventory) RestockSale(context.Context, inventory.RestockRequest) (inventory.Restocked, error) {
	return inventory.Restocked{}, f.err
}
func (f failingInventory) ListOrders(context.Context, string, string, string, int) (inventory.OrderPage, error) {
	return inventory.OrderPage{}, f.err
}
func (f failingInventory) PayOrder(context.Context, string, string) (inventory.Order, error) {
	return inventory.Order{}, f.err
}
func (f failingInventory) CancelOrder(context.Context, string, string) (inventory.Order, error) {
	return inventory.Order{}, f.err
}

func TestErrorTable(t *testing.T) {
	backendDetail := "dial tcp 10.0.0.7:5432: secret-host"
	cases := []struct {
		err        error
		status     int
		code       string
		retryAfter bool
	}{
		{fmt.Errorf("%w: too many", inventory.ErrSoldOut), 409, "sold_out", false},
		{fmt.Errorf("%w: \"x\"", inventory.ErrUnknownSKU), 404, "unknown_sku", false},
		{fmt.Errorf("%w: key", inventory.ErrIdempotencyConflict), 422, "idempotency_conflict", false},
		{fmt.Errorf("%w: id", inventory.ErrOrderNotFound), 404, "order_not_found", false},
		{fmt.Errorf("%w: id", inventory.ErrOrderPaid), 409, "paid", false},
		{fmt.Errorf("%w: u", inventory.ErrLimitReached), 409, "limit_reached", false},
		{fmt.Errorf("%w: s", inventory.ErrSaleNotStarted), 409, "not_started", false},
		{fmt.Errorf("%w: s", inventory.ErrSaleEnded), 409, "ended", false},
		{fmt.Errorf("%w: id", inventory.ErrOrderCancelled), 409, "cancelled", false},
		{fmt.Errorf("%w: id", inventory.ErrOrderExpired), 409, "expired", false},
		{fmt.Errorf("%w: id", inventory.ErrOrderFinal), 409, "final", false},
		{fmt.Errorf("%w: %w", inventory.ErrBusy, context.DeadlineExceeded), 503, "busy", true},
		{fmt.Errorf("%w: %w", inventory.ErrBusy, fmt.Errorf("%w: %s", inventory.ErrUnavailable, backendDetail)), 503, "busy", true},
		{fmt.Errorf("%w: %s", inventory.ErrUnavailable, backendDetail), 503, "unavailable", true},
		{fmt.Errorf("%w: %s", inventory.ErrOutcomeUnknown, backendDetail), 503, "unavailable", true},
		{fmt.Errorf("%w: deadlock detected (SQLSTATE 40P01)", inventory.ErrConflict), 503, "busy", true},
		// An error no adapter filed (a constraint, a driver's) is a 503
		// too: a backend failure is never a 500.
		{errors.New("a bug"), 503, "unavailable", true},
	}
	for _, c := range cases {
		h := httpapi.New(failingInventory{err: c.err})
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku":"s-1","quantity":1,"user_id":"u"}`))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		body := rec.Body.String()
		if rec.Code != c.status || !strings.Contains(body, `"code":"`+c.code+`"`) {
			t.Errorf("%v: %d %s, want %d %s", c.err, rec.Code, body, c.status, c.code)
		}
		if got := rec.Header().Get("Retry-After") != ""; got != c.retryAfter {
			t.Errorf("%v: Retry-After present %v, want %v", c.err, got, c.retryAfter)
		}
		if strings.Contains(body, "secret-host") {
			t.Errorf("%v: the answer leaks backend details: %s", c.err, body)
		}
	}
}

// TestReadyzHidesBackendDetails: /readyz tells a prober only that a backend
// does not answer; which host, user or database is in the log, not in the
// answer.
func TestReadyzHidesBackendDetails(t *testing.T) {
	detail := `failed to connect to host=db-7.internal user=stock_admin database=stock_prod: dial tcp 10.0.0.7:5432: connection refused`
	var logged bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logged, nil))
	for _, err := range []error{
		fmt.Errorf("%w: %s", inventory.ErrUnavailable, detail),
		errors.New(detail),
		errors.Join(context.DeadlineExceeded, errors.New(detail)),
	} {
		logged.Reset()
		h := httpapi.New(failingInventory{err: err}, httpapi.WithLogger(log))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		r := reply{status: rec.Code, raw: rec.Body.String()}
		if jerr := json.Unmarshal(rec.Body.Bytes(), &r.body); jerr != nil {
			t.Fatalf("%v: body %q is not JSON", err, rec.Body)
		}
		if r.status != http.StatusServiceUnavailable || r.errorCode(t) != "unavailable" || rec.Header().Get("Retry-After") == "" {
			t.Errorf("%v: %d %s, want 503 unavailable with Retry-After", err, r.status, r.raw)
		}
		for _, secret := range []string{"db-7", "stock_admin", "stock_prod", "10.0.0.7", "5432"} {
			if strings.Contains(r.raw, secret) {
				t.Errorf("%v: the answer leaks %q: %s", err, secret, r.raw)
			}
			if !strings.Contains(logged.String(), secret) {
				t.Errorf("%v: the log lacks %q: %s", err, secret, logged.String())
			}
		}
	}
}

// TestEvery503SaysWhatItMeansForItsRoute: a 503 tells the client whether
// the write may have happened and how to retry safely, in the words of its
// route: an order's busy that nothing was deducted, a restock's that
// nothing was added and that a retry with the key adds once, a lost commit
// answer that it may have happened (found by a new user: a restock's 503
// said "nothing was deducted" for a restock the database held).
func TestEvery503SaysWhatItMeansForItsRoute(t *testing.T) {
	busy := fmt.Errorf("%w: %w", inventory.ErrBusy, context.DeadlineExceeded)
	conflict := fmt.Errorf("%w: deadlock", inventory.ErrConflict)
	unknown := fmt.Errorf("%w: connection reset", inventory.ErrOutcomeUnknown)
	down := fmt.Errorf("%w: refused", inventory.ErrUnavailable)
	cases := []struct {
		method, path, body string
		err                error
		says               []string
	}{
		{"POST", "/orders", `{"sku":"s-1","quantity":1,"user_id":"u"}`, busy, []string{"nothing was deducted", "Idempotency-Key"}},
		{"POST", "/orders", `{"sku":"s-1","quantity":1,"user_id":"u"}`, unknown, []string{"may have been taken", "GET /orders?user_id="}},
		{"POST", "/orders/0190a2a4-7c5e-7b3a-9c1d-2e4f6a8b0c1d/pay", `{"user_id":"u"}`, busy, []string{"not changed", "idempotent"}},
		{"POST", "/orders/0190a2a4-7c5e-7b3a-9c1d-2e4f6a8b0c1d/cancel", `{"user_id":"u"}`, unknown, []string{"may have changed"}},
		{"POST", "/admin/stock/s-1/restock", `{"quantity":5}`, busy, []string{"nothing was added", "same Idempotency-Key"}},
		{"POST", "/admin/stock/s-1/restock", `{"quantity":5}`, conflict, []string{"nothing was added"}},
		{"POST", "/admin/stock/s-1/restock", `{"quantity":5}`, down, []string{"nothing was added by this request", "once in all"}},
		{"POST", "/admin/stock/s-1/restock", `{"quantity":5}`, unknown, []string{"may have been applied", "restocks"}},
		{"PUT", "/admin/stock/s-1", `{"available":5}`, conflict, []string{"same Idempotency-Key", "never starts the sale twice"}},
		{"PUT", "/admin/stock/s-1", `{"available":5}`, unknown, []string{"may have started"}},
		{"PUT", "/admin/stock", `[{"sku":"s-1","available":5}]`, down, []string{"may have started in the database", "same Idempotency-Key"}},
		{"PUT", "/admin/stock", `[{"sku":"s-1","available":5}]`, unknown, []string{"every sale of the catalog may have started, or none"}},
	}
	for _, c := range cases {
		h := httpapi.New(failingInventory{err: c.err}, httpapi.WithAdminToken("0123456789abcdef"))
		req := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer 0123456789abcdef")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusServiceUnavailable {
			t.Errorf("%s %s (%v): %d %s, want 503", c.method, c.path, c.err, rec.Code, rec.Body)
			continue
		}
		for _, want := range c.says {
			if !strings.Contains(rec.Body.String(), want) {
				t.Errorf("%s %s (%v): %s does not say %q", c.method, c.path, c.err, rec.Body, want)
			}
		}
		if strings.Contains(c.path, "admin") && strings.Contains(rec.Body.String(), "deducted") {
			t.Errorf("%s %s: an admin write's 503 speaks of a deduction: %s", c.method, c.path, rec.Body)
		}
	}
}
