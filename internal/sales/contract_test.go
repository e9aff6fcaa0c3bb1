package sales_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/strategies"
)

// TestWrappersKeepEveryCapability: a wrapper (LimitRowWork, AdmitThrough)
// copies the strategy it wraps and replaces its Deduct, so every other
// capability is the wrapped strategy's; a strategy that takes whole orders
// is refused when the wrapper is built. LimitRowWork(batched.New(db), n)
// used to return a gate that the Service saw as a plain deducting
// strategy: its orders were no longer batched.
func TestWrappersKeepEveryCapability(t *testing.T) {
	wholeOrders := map[string]inventory.Strategic{
		"batched":       batched.New(nil),
		"redis-reserve": reservation.NewReserved(nil, nil),
	}
	for name, s := range wholeOrders {
		if _, err := sqlrow.LimitRowWork(s, 4); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("LimitRowWork(%s) = %v, want a refusal naming it", name, err)
		}
		if _, err := sqlrow.AdmitThrough(s, nil); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("AdmitThrough(%s) = %v, want a refusal naming it", name, err)
		}
	}

	var resets []string
	down := errors.New("backend down")
	inner := sqlrow.NewConditional().Strategy()
	inner.ResetSKU = func(_ context.Context, sku string) error { resets = append(resets, sku); return nil }
	inner.Ping = func(context.Context) error { return down }
	gated, err := sqlrow.LimitRowWork(inner, 4)
	if err != nil {
		t.Fatal(err)
	}
	if gated.Name != strategies.NameConditional || gated.Validate() != nil {
		t.Errorf("the gate: %q, %v", gated.Name, gated.Validate())
	}
	if gated.ResetSKU == nil || gated.ResetSKU(context.Background(), "s-1") != nil || len(resets) != 1 {
		t.Errorf("ResetSKU not passed on: inner saw %v", resets)
	}
	if gated.Ping == nil || !errors.Is(gated.Ping(context.Background()), down) {
		t.Errorf("Ping not passed on")
	}
}

// TestStrategiesKeepTheContract: every strategy the registry builds alone
// takes orders one way, named.
func TestStrategiesKeepTheContract(t *testing.T) {
	for _, s := range strategies.All() {
		if s.New == nil {
			continue
		}
		if err := s.New().Strategy().Validate(); err != nil {
			t.Error(err)
		}
	}
	if err := (inventory.Strategy{Name: "both", Deduct: sqlrow.NewConditional().Deduct, TakeOrder: batched.New(nil).TakeOrder}).Validate(); err == nil {
		t.Error("a strategy that both deducts and takes whole orders passed Validate")
	}
}
