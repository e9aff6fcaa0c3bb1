package httpapi_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/flashsale/stock/internal/httpapi"
)

// TestRouterAnswersJSON: every answer of the router, the ones no handler of
// ours produces included (no route, wrong method, a path that differs by a
// slash or by case), is an error in the service's JSON shape, and nothing is
// redirected: gin's default would answer POST /orders/ with a 307 and a
// non-JSON body.
func TestRouterAnswersJSON(t *testing.T) {
	h := httpapi.New(failingInventory{err: errors.New("must not be called")}, httpapi.WithAdminToken(adminToken))
	cases := []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{http.MethodPost, "/orders/", 404, "not_found", ""},
		{http.MethodGet, "/stock/s-1/", 404, "not_found", ""},
		{http.MethodGet, "/healthz/", 404, "not_found", ""},
		{http.MethodGet, "/readyz/", 404, "not_found", ""},
		{http.MethodPut, "/admin/stock/s-1/", 404, "not_found", ""},
		{http.MethodGet, "/admin/audit/s-1/", 404, "not_found", ""},
		{http.MethodPost, "//orders", 404, "not_found", ""},
		{http.MethodPost, "/Orders", 404, "not_found", ""},
		{http.MethodGet, "/STOCK/s-1", 404, "not_found", ""},
		{http.MethodGet, "/stock/", 404, "not_found", ""},
		{http.MethodGet, "/stock/a/b", 404, "not_found", ""},
		{http.MethodGet, "/nowhere", 404, "not_found", ""},
		{http.MethodGet, "/", 404, "not_found", ""},
		// GET /orders lists a buyer's orders: without user_id it is a 400.
		{http.MethodGet, "/orders", 400, "invalid_request", ""},
		{http.MethodDelete, "/orders", 405, "method_not_allowed", "POST, GET"},
		{http.MethodOptions, "/orders", 405, "method_not_allowed", "POST, GET"},
		{http.MethodPost, "/stock/s-1", 405, "method_not_allowed", "GET"},
		{http.MethodDelete, "/admin/stock/s-1", 405, "method_not_allowed", "PUT"},
		{http.MethodPost, "/healthz", 405, "method_not_allowed", "GET"},
	}
	for _, c := range cases {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, strings.NewReader(`{"sku":"s-1","quantity":1,"user_id":"u"}`)))
			if loc := rec.Header().Get("Location"); loc != "" || rec.Code/100 == 3 {
				t.Fatalf("redirected: %d to %q", rec.Code, loc)
			}
			r := reply{status: rec.Code, raw: rec.Body.String()}
			if err := json.Unmarshal(rec.Body.Bytes(), &r.body); err != nil {
				t.Fatalf("status %d: body %q is not JSON", rec.Code, rec.Body)
			}
			if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type %q", ct)
			}
			if r.status != c.status || r.errorCode(t) != c.code {
				t.Errorf("%d %s, want %d %s", r.status, r.raw, c.status, c.code)
			}
			if got := rec.Header().Get("Allow"); got != c.allow {
				t.Errorf("Allow %q, want %q", got, c.allow)
			}
		})
	}
}

// TestAnswersBeforeTheRouter pins what docs/api.md says net/http answers itself,
// before any handler runs: these are plain text, not the JSON error shape.
func TestAnswersBeforeTheRouter(t *testing.T) {
	srv := httptest.NewServer(httpapi.New(failingInventory{err: errors.New("must not be called")}))
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		name, request string
		status        int
	}{
		{"malformed request line", "NOT A REQUEST\r\n\r\n", 400},
		{"HTTP/1.1 without Host", "GET /healthz HTTP/1.1\r\n\r\n", 400},
		{"header too large", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", http.DefaultMaxHeaderBytes+4096) + "\r\n\r\n", 431},
		{"unsupported HTTP version", "GET /healthz HTTP/2.5\r\nHost: x\r\n\r\n", 505},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := fmt.Fprint(conn, c.request); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != c.status {
				t.Errorf("status %d, want %d", resp.StatusCode, c.status)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("Content-Type %q: docs/api.md says text/plain", ct)
			}
		})
	}
}
