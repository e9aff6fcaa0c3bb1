package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/connlimit"
	"github.com/flashsale/stock/internal/httpapi"
	"github.com/flashsale/stock/internal/inventory"
)

// countingInventory is ready, and counts the orders that reach it.
type countingInventory struct {
	failingInventory
	orders atomic.Int64
}

func (c *countingInventory) PlaceOrder(ctx context.Context, req inventory.Request) (inventory.Order, error) {
	c.orders.Add(1)
	return inventory.Order{SKU: req.SKU, Quantity: req.Quantity, UserID: req.UserID}, nil
}

// TestOverCapServesOperatorRoutesOnly: a request on a connection over the
// cap reaches the probes and the metrics, and nothing else: every other
// route, unknown ones included, answers 503 too_many_connections in the
// error shape, with Retry-After. Every answer closes the connection.
func TestOverCapServesOperatorRoutesOnly(t *testing.T) {
	inv := &countingInventory{}
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "# metrics\n") })
	alwaysOver := func(context.Context) bool { return true }
	h := httpapi.New(inv, httpapi.WithAdminToken(adminToken), httpapi.WithMetrics(metrics), httpapi.WithOverCap(alwaysOver))
	order := `{"sku":"s-1","quantity":1,"user_id":"u"}`
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{http.MethodGet, "/healthz", 200},
		{http.MethodGet, "/readyz", 200},
		{http.MethodGet, "/metrics", 200},
		{http.MethodPost, "/orders", 503},
		{http.MethodGet, "/stock/s-1", 503},
		{http.MethodPut, "/admin/stock/s-1", 503},
		{http.MethodGet, "/admin/audit/s-1", 503},
		{http.MethodGet, "/healthz/", 503},
		{http.MethodPost, "/healthz", 503},
		{http.MethodGet, "/nowhere", 503},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(c.method, c.path, strings.NewReader(order))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+adminToken)
		h.ServeHTTP(rec, req)
		if rec.Code != c.status {
			t.Errorf("%s %s over the cap: %d %s, want %d", c.method, c.path, rec.Code, rec.Body, c.status)
		}
		if got := rec.Header().Get("Connection"); got != "close" {
			t.Errorf("%s %s over the cap: Connection %q, want close", c.method, c.path, got)
		}
		if c.status == 503 {
			r := reply{status: rec.Code, raw: rec.Body.String()}
			if err := json.Unmarshal(rec.Body.Bytes(), &r.body); err != nil {
				t.Fatalf("%s %s: body %q is not JSON", c.method, c.path, rec.Body)
			}
			if code := r.errorCode(t); code != "too_many_connections" || rec.Header().Get("Retry-After") == "" {
				t.Errorf("%s %s: %s (Retry-After %q), want too_many_connections with Retry-After", c.method, c.path, r.raw, rec.Header().Get("Retry-After"))
			}
		}
	}
	if n := inv.orders.Load(); n != 0 {
		t.Errorf("%d orders over the cap reached the inventory", n)
	}

	// Under the cap nothing changes.
	h = httpapi.New(inv, httpapi.WithOverCap(func(context.Context) bool { return false }))
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(order))
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated || rec.Header().Get("Connection") != "" || inv.orders.Load() != 1 {
		t.Errorf("under the cap: %d %s, Connection %q", rec.Code, rec.Body, rec.Header().Get("Connection"))
	}
}

// TestConnectionOverCapOverTCP wires the handler to a real connlimit
// listener: with the cap held by a connection that has sent nothing, a
// buyer's order gets the 503 and a probe gets its 200, each on a
// connection the server then closes.
func TestConnectionOverCapOverTCP(t *testing.T) {
	inv := &countingInventory{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Headroom 2: the order's connection may not be released yet when the
	// probe's arrives.
	l := connlimit.New(ln, 1, connlimit.WithHeadroom(2), connlimit.WithLogger(slog.New(slog.DiscardHandler)))
	srv := &http.Server{
		Handler:           httpapi.New(inv, httpapi.WithOverCap(connlimit.OverCap)),
		ConnState:         l.ConnState,
		ConnContext:       l.ConnContext,
		ReadHeaderTimeout: time.Minute,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		_ = srv.Close()
		<-served
	})
	dial := func() net.Conn {
		t.Helper()
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		return c
	}
	dial() // holds the cap, silent
	order := `{"sku":"s-1","quantity":1,"user_id":"u"}`

	for _, c := range []struct {
		request string
		status  int
	}{
		{fmt.Sprintf("POST /orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(order), order), 503},
		{"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 200},
	} {
		conn := dial()
		if _, err := io.WriteString(conn, c.request); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(conn)
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		line, _, _ := strings.Cut(c.request, "\r\n")
		if resp.StatusCode != c.status || (c.status == 503 && !strings.Contains(string(body), `"code":"too_many_connections"`)) {
			t.Errorf("%s over the cap: %d %s, want %d", line, resp.StatusCode, body, c.status)
		}
		if _, err := r.ReadByte(); !errors.Is(err, io.EOF) {
			t.Errorf("%s over the cap: the connection was not closed after the answer (%v)", line, err)
		}
	}
	if n := inv.orders.Load(); n != 0 {
		t.Errorf("%d orders over the cap reached the inventory", n)
	}
}
