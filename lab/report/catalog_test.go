package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// skuAudit is a SKU of a catalog with stock units, of which sold were
// ordered in as many orders, all of them answered 201.
func skuAudit(rank int, stock, sold, requests int64) SKUAudit {
	return SKUAudit{
		SKU: "cat-t-" + string(rune('a'+rank%26)) + "-" + itoa(rank), Rank: rank, Requests: requests, Created: sold,
		Audit: Audit{Initial: stock, Available: stock - sold, Ordered: sold, Orders: sold, Consistent: sold <= stock},
	}
}

func itoa(n int) string { return fmtInt(int64(n)) }

// catalogOf is a catalog of n SKUs of 20 units: rank 0 sold out after 500
// requests, ranks 1-9 sold 5 each, the rest nothing; fix changes SKUs.
func catalogOf(strategy string, n int, fix func([]SKUAudit)) *Catalog {
	skus := make([]SKUAudit, n)
	for i := range skus {
		switch {
		case i == 0:
			skus[i] = skuAudit(i, 20, 20, 500)
		case i < 10:
			skus[i] = skuAudit(i, 20, 5, 5)
		default:
			skus[i] = skuAudit(i, 20, 0, 0)
		}
	}
	if fix != nil {
		fix(skus)
	}
	c := &Catalog{
		Backend: "postgres", Strategy: strategy, Instances: 3, Prefix: "cat-t-", SKUs: n, StockPerSKU: 20,
		Workers: 100, Duration: 2 * time.Second, ZipfS: 1.3, ZipfV: 1, AdminWorkers: 16,
		Setup: 500 * time.Millisecond, Requests: 600, Orders: 65, SoldOut: 535, Elapsed: 2 * time.Second,
		OrdersPerSec: 32.5, RequestsPerSec: 300, P99: 40 * time.Millisecond, AuditTime: 400 * time.Millisecond,
	}
	if IsControl(strategy) {
		c.Orders += 7
	}
	c.AddAudits(skus)
	return c
}

// oversellRank3 makes rank 3 oversold by 7 units: 27 of 20 sold.
func oversellRank3(skus []SKUAudit) { skus[3] = skuAudit(3, 20, 27, 40) }

func TestAddAuditsFindsTheWorstSKU(t *testing.T) {
	c := catalogOf("naive", 1000, func(skus []SKUAudit) {
		oversellRank3(skus)
		// A pending order and a drift: not exact, but nothing oversold.
		skus[500].Audit.Pending = 1
		skus[700].Audit.Drift = "redis says 19 available, the database 20"
	})
	if c.Audited != 1000 || c.Exact != 997 || c.SKUsRequested != 10 || c.SKUsOrdered != 10 || c.SKUsSoldOut != 2 {
		t.Errorf("audited %d, exact %d, requested %d, ordered %d, sold out %d", c.Audited, c.Exact, c.SKUsRequested, c.SKUsOrdered, c.SKUsSoldOut)
	}
	if c.Worst == nil || c.Worst.Rank != 3 || c.Worst.Oversold() != 7 {
		t.Fatalf("worst %+v, want rank 3 oversold by 7", c.Worst)
	}
	if len(c.NotExact) != 3 || c.NotExact[0].Rank != 3 {
		t.Errorf("not exact: %+v", c.NotExact)
	}
	if c.Hottest == nil || c.Hottest.Rank != 0 || c.Hottest.Requests != 500 {
		t.Errorf("hottest %+v", c.Hottest)
	}
	if c.Initial != 20_000 || c.Ordered != 20+27+8*5 || c.Available != c.Initial-c.Ordered {
		t.Errorf("totals: initial %d, available %d, ordered %d", c.Initial, c.Available, c.Ordered)
	}
	if want := float64(500+40+8*5) / float64(500+40+8*5); c.Top10Share != want {
		t.Errorf("top 10 share %v, want %v", c.Top10Share, want)
	}
	if v := c.Judge(); v.Status != StatusControlOversold || v.Oversold != 7 {
		t.Errorf("naive's verdict %+v", v)
	}
	for _, want := range []string{"rank 4", "27 of 20 sold", "7 units oversold"} {
		if !strings.Contains(c.Worst.Describe(), want) {
			t.Errorf("%q lacks %q", c.Worst.Describe(), want)
		}
	}

	// A 201 without its order row is a lost order, whatever the stock
	// says.
	lost := catalogOf("conditional", 100, func(skus []SKUAudit) { skus[5].Created++ })
	if v := lost.Judge(); v.Status != StatusFail || lost.Worst == nil || lost.Worst.Unconfirmed() != 1 {
		t.Errorf("lost order: %+v, worst %+v", v, lost.Worst)
	}
	clean := catalogOf("conditional", 100, nil)
	if v := clean.Judge(); v.Status != StatusOK || clean.Worst != nil || clean.Exact != 100 {
		t.Errorf("clean catalog: %+v, worst %+v", v, clean.Worst)
	}
	short := catalogOf("conditional", 100, nil)
	short.SKUs = 101
	if v := short.Judge(); v.Status != StatusError {
		t.Errorf("a SKU not audited: %+v", v)
	}
}

// TestCatalogTableShowsTheWorstSKU: the catalog table names the worst SKU
// with its figures, puts the burst on one hot SKU beside the catalog's
// orders/s, and shows one Redis and the cluster side by side.
func TestCatalogTableShowsTheWorstSKU(t *testing.T) {
	r := fixture(t)
	r.Strategies = append(r.Strategies, "redis-reserve")
	one := catalogOf("redis-reserve", 1000, nil)
	one.RedisMasters = 1
	cluster := catalogOf("redis-reserve", 1000, nil)
	cluster.RedisMasters, cluster.MasterKeys = 3, []int64{3321, 3350, 3329}
	cluster.OrdersPerSec = 41
	r.CatalogRuns = []*Catalog{cluster, catalogOf("naive", 1000, oversellRank3), catalogOf("conditional", 1000, nil), one}
	if f := strings.Join(r.Failures(), "\n"); strings.Contains(f, "catalog") {
		t.Errorf("failures: %s", f)
	}
	var html, md bytes.Buffer
	if err := WriteHTML(&html, r, nil); err != nil {
		t.Fatal(err)
	}
	if err := WriteMarkdown(&md, r, nil); err != nil {
		t.Fatal(err)
	}
	page := html.String()
	for _, want := range []string{
		"The catalog: many SKUs on sale, a few of them hot",
		`title="cat-t-d-3">…d-3 (rank 4): 27 of 20 sold in 27 orders, −7 left`, "7 units oversold",
		"999 / 1,000", "1,000 / 1,000", "none: every SKU exact; the hottest, …a-0 (rank 1): 20 of 20 sold",
		"Redis Cluster, 3 masters", "keys per master 3,321 · 3,350 · 3,329", "one Redis",
		"P(rank k) ∝ (1 &#43; k)^−1.3", "orders per second across the catalog, beside the burst on one hot SKU",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	// conditional's catalog (32.5/s) beside its burst (300 units in
	// 1.125 s: 267/s).
	if !regexp.MustCompile(`\| PostgreSQL \| conditional \| – \| 1,000 \| 20 \| 0.50 s \| 32.5 \| 267 \| 0.12× \|`).MatchString(md.String()) {
		t.Errorf("report.md has no conditional catalog row beside its burst:\n%s", md.String())
	}
	// Rows in table order: the strategies as listed, one Redis before
	// the cluster.
	text := md.String()
	iNaive, iCond := strings.Index(text, "| PostgreSQL | **naive** | – | 1,000"), strings.Index(text, "| PostgreSQL | conditional | – | 1,000")
	iOne, iCluster := strings.Index(text, "| redis-reserve | one Redis"), strings.Index(text, "| redis-reserve | Redis Cluster, 3 masters")
	if iNaive < 0 || iCond < iNaive || iOne < iCond || iCluster < iOne {
		t.Errorf("row order: naive %d, conditional %d, one Redis %d, cluster %d", iNaive, iCond, iOne, iCluster)
	}
	if !strings.Contains(text, "**cat-t-d-3 (rank 4): 27 of 20 sold") {
		t.Errorf("report.md does not mark the worst SKU:\n%s", text)
	}

	// A safe strategy with a SKU that is not exact fails the demo, and
	// the failure names the SKU.
	r.CatalogRuns = append(r.CatalogRuns, catalogOf("version-cas", 1000, oversellRank3))
	if f := strings.Join(r.Failures(), "\n"); !strings.Contains(f, "postgres/version-cas catalog: 1 of 1,000 SKUs not exact; the worst, cat-t-d-3 (rank 4)") {
		t.Errorf("failures: %s", f)
	}
}

// TestProofChartShowsShares: the proof chart shows each strategy's units
// sold as a share of its own stock, so a 300-unit sale and a 30,308-unit
// one sold out draw bars of one length, and the oversold part of the
// control is a share of its stock too.
func TestProofChartShowsShares(t *testing.T) {
	r := fixture(t)
	r.Strategies = []string{"naive", "conditional", "batched"}
	big := *r.Runs[0]
	big.Strategy, big.Stock, big.Buyers = "batched", 30308, 121232
	big.Audit = &Audit{Initial: 30308, Available: 0, Ordered: 30308, Orders: 30308, Consistent: true}
	r.Runs = append(r.Runs, &big)
	view := backendViewOf(r, "postgres", r.Rows(Burst), r.Rows(Steady))
	svg := string(view.Oversell)
	for _, want := range []string{
		"share of each strategy&#39;s own stock", "100%: 300 of 300 units", "100%: 30,308 of 30,308 units",
		"115%: 345 of 300 units, 45 oversold", "the stock: 100%", "30,308 units", ">100%<",
	} {
		if !strings.Contains(svg, want) {
			t.Errorf("the proof chart lacks %q:\n%s", want, svg)
		}
	}
	widths := regexp.MustCompile(`<rect class="b-sold" x="[0-9.]+" y="[0-9.]+" width="([0-9.]+)" height="[0-9]+"><title>`).FindAllStringSubmatch(svg, -1)
	if len(widths) != 3 {
		t.Fatalf("%d sold bars, want 3 (naive, conditional, batched)", len(widths))
	}
	// naive sold its 300 and then 45 more; conditional 300 of 300;
	// batched 30,308 of 30,308: three full bars of the same length.
	if widths[0][1] != widths[1][1] || widths[1][1] != widths[2][1] {
		t.Errorf("sold-out bars differ in length: %s, %s, %s", widths[0][1], widths[1][1], widths[2][1])
	}
	over := regexp.MustCompile(`<rect class="b-control" x="[0-9.]+" y="[0-9.]+" width="([0-9.]+)" height="[0-9]+"><title>`).FindStringSubmatch(svg)
	if over == nil {
		t.Fatal("no oversold bar")
	}
	var w100, w15 float64
	if _, err := fmt.Sscan(widths[0][1], &w100); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscan(over[1], &w15); err != nil {
		t.Fatal(err)
	}
	// 45 of 300 is 15% of the stock: 0.15 of a full bar.
	if d := w15/w100 - 0.15; d < -0.01 || d > 0.01 {
		t.Errorf("oversold bar %.1f against a full bar of %.1f: want 15%%", w15, w100)
	}
}

// TestCatalogsOfARealRun renders the catalog runs a quick demo wrote
// (testdata/catalogs.json) beside the bursts of the fixture: naive's worst
// SKU with its figures, conditional exact, db-lock's refused set-up as a
// failure, redis-reserve's two rows.
func TestCatalogsOfARealRun(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "catalogs.json"))
	if err != nil {
		t.Fatal(err)
	}
	r := fixture(t)
	if err := json.Unmarshal(b, &r.CatalogRuns); err != nil {
		t.Fatal(err)
	}
	r.Strategies = []string{"naive", "conditional", "db-lock", "redis-reserve"}
	cats := r.Catalogs()
	if len(cats) != 5 || cats[0].Strategy != "naive" || cats[3].RedisMasters != 1 || cats[4].RedisMasters != 3 {
		t.Fatalf("catalogs out of order: %d", len(cats))
	}
	naive := cats[0]
	if v := naive.Judge(); v.Status != StatusControlOversold || v.Oversold != 11 || naive.Worst.Rank != 3 {
		t.Errorf("naive: %+v, worst %+v", v, naive.Worst)
	}
	f := strings.Join(r.Failures(), "\n")
	if !strings.Contains(f, "postgres/db-lock catalog: run failed: putting 1000 SKUs on sale") || strings.Contains(f, "naive catalog") {
		t.Errorf("failures: %s", f)
	}
	var html, md bytes.Buffer
	if err := WriteHTML(&html, r, nil); err != nil {
		t.Fatal(err)
	}
	if err := WriteMarkdown(&md, r, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"**cat-20261128004238-po-naive-db-003 (rank 4): 31 of 20 sold in 31 orders, −11 left; 99 orders sent, 31 × 201; 11 units oversold**",
		"| PostgreSQL | **naive** | – | 1,000 | 20 | 1.68 s | 361 | 209 | 1.7× |", "| 809 / 20,000 (4%) |", "| 990 / 1,000 |",
		"| MariaDB | redis-reserve | Redis Cluster, 3 masters (keys per master ",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report.md lacks %q:\n%s", want, md.String())
		}
	}
	for _, want := range []string{`title="cat-20261128004238-po-naive-db-003">…003 (rank 4): 31 of 20 sold`, "up to 11 units of one SKU on PostgreSQL (catalog)"} {
		if !strings.Contains(html.String(), want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}
