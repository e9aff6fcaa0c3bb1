package failover_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testpatroni"
	"github.com/flashsale/stock/lab/teststrategy"
)

// A commit whose wait for the synchronous standby was ended by a
// termination is visible on the primary before the standby has it. A
// retry with the same Idempotency-Key finds the order there and, before,
// answered 201 from that read at once: a read commits nothing, so it waited
// for no standby, and a failover then would have lost an order answered
// 201 (found by review). The replay must wait for the standby as the first
// attempt's commit did: while the standby lags, 503 (it may have been
// taken); once it has the order, 201 with the order. For conditional (the
// service's transaction) and batched (the strategy's own).
func TestARetryOfAnOrderItsStandbyLacksIsNotAnswered201(t *testing.T) {
	for _, strategy := range []string{strategies.NameConditional, strategies.NameBatched} {
		t.Run(strategy, func(t *testing.T) {
			retryOrderTheStandbyLacks(t, strategy)
		})
	}
}

func retryOrderTheStandbyLacks(t *testing.T, strategy string) {
	c := testpatroni.Start(t, testpatroni.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	name := patroniDatabase(ctx, t, c)
	// The first attempt's deadline outlasts the test's waits; the retry's
	// is short, as a client's next attempt would be answered.
	first, db := patroniService(ctx, t, c, name, strategy, 60*time.Second)
	retry, _ := patroniService(ctx, t, c, name, strategy, 2*time.Second)
	const sku = "replay"
	if err := first.StartSale(ctx, sku, 10); err != nil {
		t.Fatalf("start sale: %v", err)
	}
	primary, standby := primaryAndStandby(ctx, t, c)
	if err := standby.FreezeReplication(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(standby.ThawReplication)

	req := inventory.Request{SKU: sku, Quantity: 1, UserID: "retrying-buyer", IdempotencyKey: "retried-key"}
	answered := endWaitingCommit(ctx, t, first, req, primary, name, "pg_terminate_backend")
	// The order is on the primary now, not on the standby.
	if rows := ordersOf(ctx, t, db, req.UserID, sku); rows != 1 {
		t.Fatalf("the primary has %d orders of the buyer after the termination, want 1", rows)
	}
	o, err := retry.PlaceOrder(ctx, req)
	if err == nil {
		t.Fatalf("the retry was answered 201 (order %s) while the synchronous standby lacks the order: a failover now would lose it", o.ID)
	}
	if !errors.Is(err, inventory.ErrUnavailable) {
		t.Fatalf("the retry while the standby lags: %v, want 503", err)
	}
	standby.ThawReplication()
	var r teststrategy.Answer
	select {
	case r = <-answered:
	case <-ctx.Done():
		t.Fatal("the first attempt was not answered within 2 minutes")
	}
	again, err := retry.PlaceOrder(ctx, req)
	if err != nil {
		t.Fatalf("the retry once the standby has the order: %v, want 201", err)
	}
	if r.Err == nil && r.Order.ID != again.ID {
		t.Errorf("the retry answered order %s, the first attempt %s", again.ID, r.Order.ID)
	}
	if rows := ordersOf(ctx, t, db, req.UserID, sku); rows != 1 {
		t.Errorf("the buyer has %d orders, want the one", rows)
	}
}
