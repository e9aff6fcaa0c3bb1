package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/lab/testdb"
)

// TestAbuse: huge headers, a body that never finishes, and a flood of
// unknown SKUs get 4xx answers (or a closed connection), never a 5xx, and
// leave neither stock, tables nor the process's memory any different.
func TestAbuse(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real service process")
	}
	url := testdb.URL(t, "postgres")
	// GOGC=25, not the service's 400: the memory check below compares
	// resident sizes, and at 400 the heap swings by five times what is
	// live between collections, tens of MB either way (seen in CI: +16 MB
	// over 10,000 orders at b4f8b97 as at later commits, and -40 MB in
	// other runs), which hides or feigns the 10 MB a leak would add.
	p := startInstance(t, "DATABASE_URL="+url, "STRATEGY=conditional", "HTTP_READ_TIMEOUT=1s", "GOGC=25")
	adminJSON(t, http.MethodPut, p.url+"/admin/stock/real", `{"available":10}`, nil)
	addr := strings.TrimPrefix(p.url, "http://")

	t.Run("huge headers", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, p.url+"/orders", strings.NewReader(`{"sku":"real","quantity":1,"user_id":"u"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Padding", strings.Repeat("x", 256<<10))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("256 KiB of headers: %d, want 431", resp.StatusCode)
		}
	})

	t.Run("slow body", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// Promise 100 bytes, send 10, then nothing: the read timeout must
		// end the request instead of waiting for ever.
		fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"sku\":\"re")
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode >= 500 {
				t.Errorf("a stalled body got %d", resp.StatusCode)
			}
			return
		}
		var netErr net.Error
		if errors.As(err, &netErr) && netErr.Timeout() {
			t.Fatalf("the server kept a stalled request open for 10s")
		}
		// Otherwise the server closed the connection: what we want.
	})

	t.Run("10,000 unknown SKUs", func(t *testing.T) {
		rows := tableRows(t, url)
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
		defer client.CloseIdleConnections()
		// ghosts sends n orders for SKUs never seen before, 16 at a time,
		// and checks that each is 404.
		ghosts := func(from, n int) {
			var wg sync.WaitGroup
			statuses := make(chan int, n)
			sem := make(chan struct{}, 16)
			for i := from; i < from+n; i++ {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					body := fmt.Sprintf(`{"sku":"ghost-%d","quantity":1,"user_id":"u"}`, i)
					resp, err := client.Post(p.url+"/orders", "application/json", strings.NewReader(body))
					if err != nil {
						t.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					statuses <- resp.StatusCode
				}()
			}
			wg.Wait()
			close(statuses)
			counts := map[int]int{}
			for s := range statuses {
				counts[s]++
			}
			if counts[http.StatusNotFound] != n {
				t.Errorf("answers %v, want %d × 404", counts, n)
			}
		}
		// The first 10,000 warm the pools, caches and the heap the
		// garbage collector settles at; the next 10,000 new SKUs must not
		// grow the process: 10,000 remembered SKUs of even 1 KiB each
		// would be 10 MiB.
		ghosts(0, 10000)
		before := rss(t, p.cmd.Process.Pid)
		ghosts(10000, 10000)
		after := rss(t, p.cmd.Process.Pid)
		t.Logf("RSS %d KiB -> %d KiB over the second 10,000", before, after)
		if after-before > 8<<10 {
			t.Errorf("resident memory grew by %d KiB", after-before)
		}
		if got := tableRows(t, url); got != rows {
			t.Errorf("table rows %v -> %v", rows, got)
		}
	})

	var a auditBody
	adminJSON(t, http.MethodGet, p.url+"/admin/audit/real", "", &a)
	if a.Available != 10 || a.Orders != 0 {
		t.Errorf("abuse changed the stock: %+v", a)
	}
}

// rss reads the resident set size of a process in KiB.
func rss(t *testing.T, pid int) int {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// tableRows counts the rows of the service's tables.
func tableRows(t *testing.T, url string) [3]int64 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n [3]int64
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM stock), (SELECT count(*) FROM orders), (SELECT count(*) FROM idempotency_keys)`).Scan(&n[0], &n[1], &n[2]); err != nil {
		t.Fatal(err)
	}
	return n
}
