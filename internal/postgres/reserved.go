package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
)

// PersistReserved writes orders that the redis-reserve strategy accepted in
// Redis during sale epoch (reservation.PersistOne).
func (s *Store) PersistReserved(ctx context.Context, sku string, epoch int64, orders []inventory.Order, keys []inventory.IdempotencyRecord) (int, error) {
	return reservation.PersistOne(ctx, s, sku, epoch, orders, keys)
}

// PersistReservedEach implements reservation.Sink in one transaction: the
// batches' stock rows are locked in SKU order (COLLATE "C": two consumers
// whose batches share SKUs queue, never deadlock) and their sales read,
// then reservation.WriteJudged writes what is of the current sale. The
// deduction is unconditional: Redis accepted these orders against the same
// initial stock, so the database can only follow it, never refuse it.
func (s *Store) PersistReservedEach(ctx context.Context, batches []reservation.SaleBatch) ([]reservation.SaleBatchOutcome, error) {
	var outcomes []reservation.SaleBatchOutcome
	err := s.inTx(ctx, func(ctx context.Context, t *tx) error {
		rows, err := t.tx.Query(ctx, `
			SELECT sku, sale_epoch FROM stock WHERE sku = ANY($1::text[]) ORDER BY sku COLLATE "C" FOR UPDATE`,
			reservation.BatchSKUs(batches))
		if err != nil {
			return wrap(ctx, err)
		}
		current := map[string]int64{}
		var sku string
		var epoch int64
		if _, err := pgx.ForEachRow(rows, []any{&sku, &epoch}, func() error {
			current[sku] = epoch
			return nil
		}); err != nil {
			return wrap(ctx, err)
		}
		outcomes, err = reservation.WriteJudged(batches, current, func(orders []inventory.Order, keys []inventory.IdempotencyRecord) (map[string]int, error) {
			return t.writeReserved(ctx, orders, keys)
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	return outcomes, nil
}

// writeReserved inserts the orders not written yet, deducts each SKU's
// total and stores the idempotency records; it returns how many orders of
// each SKU it wrote. The caller holds the SKUs' stock rows locked, which
// serialises the writers of their orders, so ON CONFLICT only ever meets
// orders committed before.
func (t *tx) writeReserved(ctx context.Context, orders []inventory.Order, keys []inventory.IdempotencyRecord) (map[string]int, error) {
	n := len(orders)
	ids, skus, users, strategies, states := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	quantities, holds, claimed := make([]int64, n), make([]int64, n), make([]int64, n)
	expiries := make([]*time.Time, n)
	for i, o := range orders {
		ids[i], skus[i], quantities[i], users[i], strategies[i] = o.ID, o.SKU, o.Quantity, o.UserID, o.Strategy
		states[i], holds[i], claimed[i], expiries[i] = stateOf(o), o.Hold.Microseconds(), o.Claimed, timeOrNull(o.ExpiresAt)
	}
	// A held order's hold runs from here, on the database's clock, as the
	// SQL strategies' do: its buyer can pay from now on, for the whole
	// hold. Its 201 promised ExpiresAt (Redis's time of the order plus the
	// hold), which this is never earlier than (GREATEST, also when Redis's
	// clock runs ahead of the database's): a consumer that lags never
	// shortens a hold (found by review:
	// TestHeldOrderCanBePaidAfterTheConsumerCatchesUp). The deduction
	// follows the rows inserted (a CTE's UPDATE runs whether or not the
	// query reads it).
	rows, err := t.tx.Query(ctx, `
		WITH written AS (
			INSERT INTO orders (id, sku, quantity, user_id, strategy, state, expires_at, claimed)
			SELECT id::uuid, sku, quantity, user_id, strategy, state,
			       GREATEST(expires, CASE WHEN hold > 0 THEN statement_timestamp() + hold * interval '1 microsecond' END), claimed
			FROM unnest($1::text[], $2::text[], $3::integer[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::timestamptz[], $9::bigint[])
			     AS o (id, sku, quantity, user_id, strategy, state, hold, expires, claimed)
			ON CONFLICT (id) DO NOTHING
			RETURNING sku, quantity
		), totals AS (
			SELECT sku, COUNT(*) AS orders, SUM(quantity) AS units FROM written GROUP BY sku
		), deducted AS (
			UPDATE stock s SET available = s.available - t.units, version = s.version + 1
			FROM totals t WHERE s.sku = t.sku
		)
		SELECT sku, orders FROM totals`,
		ids, skus, quantities, users, strategies, states, holds, expiries, claimed)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	written := map[string]int{}
	for rows.Next() {
		var sku string
		var count int64
		if err := rows.Scan(&sku, &count); err != nil {
			rows.Close()
			return nil, wrap(ctx, err)
		}
		written[sku] = int(count)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, wrap(ctx, err)
	}
	if len(keys) > 0 {
		// A key that exists already belongs to an order written before
		// (this batch's earlier delivery): nothing to add.
		if _, err := t.InsertIdempotencyRecords(ctx, reservation.KeysInOrder(keys)); err != nil {
			return nil, err
		}
	}
	return written, nil
}

// RecheckSale runs check in one transaction that holds the SKU's stock row
// locked, so no batch of the SKU commits meanwhile and checks of several
// instances queue; it commits when check returns nil. check may read the
// sale's audit (Sale is its number), write orders as PersistReserved does
// (without comparing numbers), and renumber the sale (its stock and orders
// stay). ErrUnknownSKU when there is no row.
func (s *Store) RecheckSale(ctx context.Context, sku string, check func(ctx context.Context, r reservation.SaleRecheck) error) error {
	return s.inTx(ctx, func(ctx context.Context, t *tx) error {
		var current int64
		err := t.tx.QueryRow(ctx, `SELECT sale_epoch FROM stock WHERE sku = $1 FOR UPDATE`, sku).Scan(&current)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %q", inventory.ErrUnknownSKU, sku)
		}
		if err != nil {
			return wrap(ctx, err)
		}
		return check(ctx, pgRecheck{t: t, sku: sku})
	})
}

type pgRecheck struct {
	t   *tx
	sku string
}

func (r pgRecheck) Audit(ctx context.Context) (inventory.Audit, error) {
	a := inventory.Audit{SKU: r.sku}
	if err := r.t.tx.QueryRow(ctx, `SELECT initial, available, sale_epoch FROM stock WHERE sku = $1`, r.sku).Scan(&a.Initial, &a.Available, &a.Sale); err != nil {
		return a, wrap(ctx, err)
	}
	err := r.t.tx.QueryRow(ctx, `SELECT COALESCE(SUM(quantity), 0), COUNT(*) FROM orders WHERE sku = $1`, r.sku).Scan(&a.Ordered, &a.Orders)
	return a, wrap(ctx, err)
}

func (r pgRecheck) Write(ctx context.Context, orders []inventory.Order, keys []inventory.IdempotencyRecord) error {
	_, err := r.t.writeReserved(ctx, orders, keys)
	return err
}

func (r pgRecheck) Renumber(ctx context.Context, to int64) error {
	_, err := r.t.tx.Exec(ctx, `UPDATE stock SET sale_epoch = $2 WHERE sku = $1`, r.sku, to)
	return wrap(ctx, err)
}
