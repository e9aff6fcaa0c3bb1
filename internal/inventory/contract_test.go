package inventory_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
)

// pingingStrategy deducts nothing and has a backend of its own.
type pingingStrategy struct {
	inventory.Strategy
	resets []string
	down   error
}

func (p *pingingStrategy) ResetSKU(_ context.Context, sku string) error {
	p.resets = append(p.resets, sku)
	return nil
}

func (p *pingingStrategy) Ping(context.Context) error { return p.down }

// TestWrappersForwardOrRefuse: a wrapper (LimitRowWork, AdmitThrough)
// passes on every capability of the strategy it wraps, or refuses the
// strategy when it is built. LimitRowWork(batched.New(db), n) used to
// return a gate that the Service saw as a plain deducting strategy: its
// orders were no longer batched.
func TestWrappersForwardOrRefuse(t *testing.T) {
	wholeOrders := map[string]inventory.Strategy{
		"batched":       batched.New(nil),
		"redis-reserve": inventory.NewReserved(nil, nil),
	}
	for name, s := range wholeOrders {
		if _, err := inventory.LimitRowWork(s, 4); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("LimitRowWork(%s) = %v, want a refusal naming it", name, err)
		}
		if _, err := inventory.AdmitThrough(s, nil); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("AdmitThrough(%s) = %v, want a refusal naming it", name, err)
		}
	}

	inner := &pingingStrategy{Strategy: inventory.NewConditional(), down: errors.New("backend down")}
	gated, err := inventory.LimitRowWork(inner, 4)
	if err != nil {
		t.Fatal(err)
	}
	if gated.Name() != inventory.NameConditional {
		t.Errorf("name %q", gated.Name())
	}
	r, ok := gated.(inventory.SKUStateResetter)
	if !ok {
		t.Fatal("the gate does not pass ResetSKU on")
	}
	if err := r.ResetSKU(context.Background(), "s-1"); err != nil || len(inner.resets) != 1 {
		t.Errorf("ResetSKU: %v, inner saw %v", err, inner.resets)
	}
	p, ok := gated.(inventory.Pinger)
	if !ok {
		t.Fatal("the gate does not pass Ping on")
	}
	if err := p.Ping(context.Background()); !errors.Is(err, inner.down) {
		t.Errorf("Ping: %v, want the inner strategy's %v", err, inner.down)
	}
}
