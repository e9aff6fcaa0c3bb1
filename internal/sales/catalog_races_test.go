package sales_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testredis"
)

// Review of the catalog start (ae45af4): schedules that break its claims.

// reservedService is a redis-reserve service on db and the Redis at addr,
// without a consumer (accepted orders stay unwritten: a consumer that
// lags), as one instance of the service.
func reservedService(t *testing.T, db store.Store, addr string) *sales.Service {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	res := reservation.New(rdb, db)
	return sales.NewService(db, reservation.NewReserved(res, db), sales.WithOrderTimeout(10*time.Second))
}

// TestCatalogStartRenumbersAboveRedisAsOneSKUStartsDo: Redis has seen a
// sale number of one SKU that this database has not given (another
// database shares the Redis, or the database was reset). A start of one
// SKU renumbers above it and succeeds; so must a catalog that holds that
// SKU. The catalog's first attempt announces the numbers of its other
// SKUs in Redis (close.lua SETs them) and rolls back; a second attempt
// that gave those SKUs the same numbers again (AtLeast only the behind
// SKU's number) found Redis had seen them, and the request failed with a
// bare *SaleNumberBehind (a 503 "unavailable"), every SKU of it closed in
// Redis.
//
//	db2: start A (Redis: A announced and loaded as sale S)
//	db1: start B (B is sale S in db1 and Redis)
//	db1: catalog [A, B], attempt 0: A=S (Redis saw S: behind, Seen=S), B=2S (announced), rollback
//	     attempt 1 (AtLeast=S): A=2S, B=(max(S,S)/S+1)*S=2S; Redis saw B=2S: behind again -> error
func TestCatalogStartRenumbersAboveRedisAsOneSKUStartsDo(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			ctx := context.Background()
			srv := testredis.Start(t)
			db1, db2 := testdb.New(t, engine, 8), testdb.New(t, engine, 8)
			svc1, svc2 := reservedService(t, db1, srv.Addr), reservedService(t, db2, srv.Addr)
			if err := svc2.StartSale(ctx, "A", 5); err != nil {
				t.Fatal(err)
			}
			if err := svc1.StartSale(ctx, "B", 5); err != nil {
				t.Fatal(err)
			}
			// The control: a start of one SKU Redis is ahead on renumbers and succeeds.
			if err := svc2.StartSale(ctx, "C", 5); err != nil {
				t.Fatal(err)
			}
			if err := svc1.StartSale(ctx, "C", 5); err != nil {
				t.Fatalf("control: a start of one SKU that Redis is ahead on: %v", err)
			}

			_, err := svc1.OpenCatalog(ctx, inventory.CatalogRequest{Sales: []inventory.SaleRequest{{SKU: "A", Available: 5}, {SKU: "B", Available: 5}}})
			if err != nil {
				var behind *reservation.SaleNumberBehind
				t.Fatalf("a catalog with one SKU Redis is ahead on: %v (SaleNumberBehind: %v), want it renumbered and started as a one-SKU start is", err, errors.As(err, &behind))
			}
			for _, sku := range []string{"A", "B"} {
				if _, err := svc1.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "u"}); err != nil {
					t.Errorf("order of %s after the catalog's start: %v", sku, err)
				}
			}
		})
	}
}

// TestCatalogRetryNeverReopensASaleRedisLost: a sale took an order (201,
// not yet written), then Redis came back from an older copy; the check of
// the SKU renumbers the database's sale e -> e+1 and closes Redis under
// e+1 (closeLost). A retry of a one-SKU start (FinishStart with the key's
// number e) finds e+1 announced: STALE, the SKU stays closed (503) until a
// new sale. A retry of the catalog's start must do the same: finishing the
// number in the row now (e+1, SaleRows), exactly the announcement
// closeLost made, passed Resume's guard and opened the sale again with
// all its units, the lost order's units sold a second time.
//
//	start X, Y (sale S); copy of Redis taken
//	catalog [X] with key K (X: sale 2S); one-SKU start Y with key K' (Y: sale 2S)
//	order on X, order on Y: 201, unwritten (the consumer lags)
//	Redis comes back from the copy (X, Y: sale S)
//	order on X, on Y: check: database 2S -> 2S+1, Redis closed under 2S+1
//	retry K': Resume(2S) STALE, Y stays closed.  retry K: Resume(2S+1) opens X with 5 units
func TestCatalogRetryNeverReopensASaleRedisLost(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t, "postgres", 8)
	srv := testredis.StartDurable(t)
	svc := reservedService(t, db, srv.Addr)

	for _, sku := range []string{"X", "Y"} {
		if err := svc.StartSale(ctx, sku, 5); err != nil {
			t.Fatal(err)
		}
	}
	backup := srv.Snapshot(t)

	catalog := inventory.CatalogRequest{IdempotencyKey: "catalog-K", Sales: []inventory.SaleRequest{{SKU: "X", Available: 5}}}
	if _, err := svc.OpenCatalog(ctx, catalog); err != nil {
		t.Fatal(err)
	}
	one := inventory.SaleRequest{SKU: "Y", Available: 5, IdempotencyKey: "one-K"}
	if _, err := svc.OpenSale(ctx, one); err != nil {
		t.Fatal(err)
	}
	for _, sku := range []string{"X", "Y"} {
		if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "lost"}); err != nil {
			t.Fatalf("order of %s: %v", sku, err)
		}
	}

	srv.Restore(t, backup)
	for _, sku := range []string{"X", "Y"} {
		_, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "after"})
		t.Logf("order of %s after Redis came back from the copy: %v", sku, err)
		if a, err := db.Audit(ctx, sku); err == nil {
			t.Logf("%s in the database: sale %d, %d orders", sku, a.Sale, a.Orders)
		}
	}

	if r, err := svc.OpenSale(ctx, one); err != nil || !r.Replayed {
		t.Logf("retry of the one-SKU start: %+v %v", r, err)
	}
	if r, err := svc.OpenCatalog(ctx, catalog); err != nil || !r.Replayed {
		t.Logf("retry of the catalog start: %+v %v", r, err)
	}
	if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "Y", Quantity: 1, UserID: "again"}); err == nil {
		t.Errorf("control: the one-SKU start's retry reopened Y, whose order Redis lost")
	}
	if o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "X", Quantity: 5, UserID: "again"}); err == nil {
		t.Errorf("the catalog's retry reopened X, whose 201 order Redis lost: order %s took all 5 units again", o.ID)
	}
}

// TestCatalogRowWhoseWindowTheStoreCannotKeepIsRefusedByItsRow: a row
// whose window bound MariaDB's DATETIME cannot hold (here 9999-12-31T23:30
// at -01:00, which is year 10000 in UTC, as decodeCatalog converts it)
// must be a 400 naming its row, as every bad row is, not the driver's
// refusal to format the time filed as "unavailable": a 503 that tells the
// admin to retry, which fails again every time.
func TestCatalogRowWhoseWindowTheStoreCannotKeepIsRefusedByItsRow(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t, "mysql", 4)
	svc := sales.NewService(db, sqlrow.NewConditional())
	far := time.Date(9999, 12, 31, 23, 30, 0, 0, time.FixedZone("", -3600)).UTC()
	_, err := svc.OpenCatalog(ctx, inventory.CatalogRequest{Sales: []inventory.SaleRequest{
		{SKU: "ok", Available: 5},
		{SKU: "far", Available: 5, Window: inventory.SaleWindow{EndsAt: far}},
	}})
	if !errors.Is(err, inventory.ErrInvalid) || !strings.Contains(err.Error(), `row 1 (sku "far")`) {
		t.Fatalf("a row ending in year %d: %v (unavailable: %v), want invalid naming row 1", far.Year(), err, errors.Is(err, inventory.ErrUnavailable))
	}
}

// TestCatalogStartOnMariaDBDoesNotDeadlockAnOrder: on MariaDB a catalog
// of more than 1,000 SKUs writes in chunks. Had it deleted chunk 1's
// orders (next-key locks in orders) before upserting chunk 2, an order of
// a SKU of chunk 2 that locked its stock row before the catalog got there
// would wait on that gap to insert its order row while the catalog waited
// on its stock row: a deadlock, which SKU order does not prevent (a start
// of one SKU cannot form it: it holds one stock row). Every stock row is
// now taken before any delete.
//
//	T (order of s1000): UPDATE stock s1000 (locked)
//	K (catalog s0000..s1000): chunk 1 upserted, its orders deleted (gap locked), chunk 2: waits on s1000
//	T: INSERT INTO orders (s1000) waits on K's gap lock: deadlock, T rolled back
func TestCatalogStartOnMariaDBDoesNotDeadlockAnOrder(t *testing.T) {
	const skus = 1001
	ctx := context.Background()
	url := testdb.MigratedURL(t, "mysql")
	db, err := store.Open(ctx, url, 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	cfg, err := dburl.MySQL(url)
	if err != nil {
		t.Fatal(err)
	}
	connector, err := gomysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	raw := sql.OpenDB(connector)
	t.Cleanup(func() { _ = raw.Close() })

	svc := sales.NewService(db, sqlrow.NewConditional(), sales.WithTxAttempts(1))
	req := inventory.CatalogRequest{Sales: make([]inventory.SaleRequest, skus)}
	for i := range req.Sales {
		req.Sales[i] = inventory.SaleRequest{SKU: fmt.Sprintf("s%04d", i), Available: 5}
	}
	if _, err := svc.OpenCatalog(ctx, req); err != nil {
		t.Fatal(err)
	}
	last := req.Sales[skus-1].SKU

	locked, insert := make(chan struct{}), make(chan struct{})
	var orderErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		orderErr = db.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
			if ok, err := tx.DeductIfAvailable(ctx, last, 1); err != nil || !ok {
				return fmt.Errorf("deduct: %v %w", ok, err)
			}
			close(locked)
			<-insert
			_, err := tx.InsertOrder(ctx, inventory.Order{ID: uuid.NewString(), SKU: last, Quantity: 1, UserID: "u", Strategy: "conditional", State: inventory.OrderFinal})
			return err
		})
	})
	<-locked
	var catalogErr error
	wg.Go(func() { _, catalogErr = svc.OpenCatalog(ctx, req) })
	// Until the catalog waits for the order's stock row (its chunk 2's
	// upsert, blocked for half a second).
	deadline := time.Now().Add(15 * time.Second)
	for {
		var n int
		if err := raw.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND INFO LIKE '%INSERT INTO stock%' AND TIME_MS > 500`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			close(insert)
			wg.Wait()
			t.Fatalf("the catalog never waited for the order's row: catalog %v, order %v", catalogErr, orderErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(insert)
	wg.Wait()
	if catalogErr != nil {
		t.Errorf("the catalog: %v", catalogErr)
	}
	if orderErr != nil {
		t.Errorf("the order of %s (its stock row locked before the catalog reached it): %v, conflict %v", last, orderErr, errors.Is(orderErr, inventory.ErrConflict))
	}
}
