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
func (f failingInventory) StartSaleWindow(context.Context, string, int64, inventory.SaleWindow) error {
	return f.err
}
func (f failingInventory) Audit(context.Context, string) (inventory.Audit, error) {
	return inventory.Audit{}, f.err
}
func (f failingInventory) Ready(context.Context) error { return f.err }
func (f failingInventory) FindOrder(context.Context, string, string) (inventory.Order, error) {
	return inventory.Order{}, f.err
}
func (f failingInventory) Restock(context.Context, string, int64) (inventory.Level, error) {
	return inventory.Level{}, f.err
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
		{errors.New("a bug"), 500, "internal", false},
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
