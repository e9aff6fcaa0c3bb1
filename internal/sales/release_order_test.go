package sales_test

// The statements that give buyers' units back to many buyers at once:
// the sweep's (Tx.ReleaseEach, every SKU of its batch) and a batch's
// (ReleaseUnitsOf, one SKU's buyers); the harness is
// lifecycle_races_test.go's.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
)

// TestReleaseUnitsOfLocksInBuyerOrder (PostgreSQL): an UPDATE … FROM
// unnest($2, $3) alone locks the rows in the order its join emits them. A
// hash join that hashes the list and scans the table (a plan the review
// found likely for a sweep's hundreds of buyers on a SKU of many rows)
// locks them in heap order: here u-z, u-m, u-a, then the fillers. A (200
// buyers) would lock u-z and wait for u-m (held by C); B (u-a, u-z) lock
// u-a and wait for u-z (A); C commits; A wants u-a (B): a cycle, broken
// after deadlock_timeout, every buyer row in it held for a second. On this
// small table PostgreSQL hashes the table instead (list order), so this
// guards the order each statement now takes itself (locked first, ORDER
// BY user_id COLLATE "C"), whatever the plan: B queues behind A, both
// commit.
func TestReleaseUnitsOfLocksInBuyerOrder(t *testing.T) {
	type unitsOf interface {
		ReleaseUnitsOf(ctx context.Context, sku string, units map[string]int64) error
	}
	for name, release := range map[string]func(ctx context.Context, tx inventory.Tx, sku string, units map[string]int64) error{
		"the sweep's ReleaseEach": func(ctx context.Context, tx inventory.Tx, sku string, units map[string]int64) error {
			var claims []inventory.Order
			for u, q := range units {
				claims = append(claims, inventory.Order{SKU: sku, UserID: u, Quantity: q})
			}
			slices.SortFunc(claims, func(a, b inventory.Order) int { return strings.Compare(a.UserID, b.UserID) })
			return tx.ReleaseEach(ctx, claims)
		},
		"a batch's ReleaseUnitsOf": func(ctx context.Context, tx inventory.Tx, sku string, units map[string]int64) error {
			return tx.(unitsOf).ReleaseUnitsOf(ctx, sku, units)
		},
	} {
		t.Run(name, func(t *testing.T) { releasesLockInBuyerOrder(t, release) })
	}
}

func releasesLockInBuyerOrder(t *testing.T, releaseUnits func(ctx context.Context, tx inventory.Tx, sku string, units map[string]int64) error) {
	db, raw := dbWithRawAccess(t, "postgres", 8)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const sku = "heap"
	// Heap order is insertion order on a fresh table.
	for _, u := range []string{"u-z", "u-m", "u-a"} {
		raw.exec(t, `INSERT INTO buyer_units (sku, user_id, units) VALUES ($1, $2, 5)`, ``, sku, u)
	}
	raw.exec(t, `INSERT INTO buyer_units (sku, user_id, units)
		SELECT $1, 'f-' || lpad(i::text, 4, '0'), 5 FROM generate_series(0, 1999) AS i`, ``, sku)
	raw.exec(t, `ANALYZE buyer_units`, ``)

	unitsA := map[string]int64{"u-a": 1, "u-m": 1, "u-z": 1}
	for i := range 197 {
		unitsA[fmt.Sprintf("f-%04d", i)] = 1
	}
	unitsB := map[string]int64{"u-a": 1, "u-z": 1}

	// C: a transaction of the test's own holds u-m.
	c, err := raw.pg.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Rollback(context.Background()) }()
	var cPid int64
	if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&cPid); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, `SELECT 1 FROM buyer_units WHERE sku = $1 AND user_id = 'u-m' FOR UPDATE`, sku); err != nil {
		t.Fatal(err)
	}
	release := func(units map[string]int64) chan error {
		done := make(chan error, 1)
		go func() {
			done <- db.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
				return releaseUnits(ctx, tx, sku, units)
			})
		}()
		return done
	}
	a := release(unitsA)
	raw.waitBlockedBy(t, cPid, 1) // A waits for u-m
	b := release(unitsB)
	raw.waitBlockedBy(t, cPid, 2) // B waits too (for A, or for C through A)
	if err := c.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{<-a, <-b} {
		if errors.Is(err, inventory.ErrConflict) {
			t.Errorf("two releases of one SKU deadlocked (%v): the rows are not locked in buyer order", err)
		} else if err != nil {
			t.Errorf("release: %v", err)
		}
	}
	if got := raw.queryInt(t, `SELECT units FROM buyer_units WHERE sku = $1 AND user_id = 'u-z'`, ``, sku); got != 3 {
		t.Errorf("u-z, released by both: %d units left of 5, want 3", got)
	}
}
