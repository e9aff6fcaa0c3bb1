package keygate_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/flashsale/stock/internal/keygate"
)

// TestGateKeepsNothingForIdleKeys: a catalog of 10,000 keys entered once
// each, and an order that gave up waiting, leave no semaphore behind.
func TestGateKeepsNothingForIdleKeys(t *testing.T) {
	g := keygate.New(1)
	for i := range 10_000 {
		leave, err := g.Enter(t.Context(), fmt.Sprintf("sku-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		leave()
	}
	leave, err := g.Enter(t.Context(), "held")
	if err != nil {
		t.Fatal(err)
	}
	gaveUp, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := g.Enter(gaveUp, "held"); !errors.Is(err, context.Canceled) {
		t.Fatalf("entered a full gate, or failed with %v, want context.Canceled", err)
	}
	if n := g.Keys(); n != 1 {
		t.Errorf("the gate keeps %d keys while one is held, want 1", n)
	}
	leave()
	leave() // a second call gives back nothing more
	if n := g.Keys(); n != 0 {
		t.Errorf("the gate keeps %d keys once nobody holds or waits, want 0", n)
	}
}

// TestGateLetsNInPerKeyAndKeysDoNotShare: n holders of one key fill it;
// another key is not held up by it.
func TestGateLetsNInPerKeyAndKeysDoNotShare(t *testing.T) {
	g := keygate.New(2)
	var leaves []func()
	for range 2 {
		leave, err := g.Enter(t.Context(), "hot")
		if err != nil {
			t.Fatal(err)
		}
		leaves = append(leaves, leave)
	}
	full, cancel := context.WithCancelCause(t.Context())
	errFull := errors.New("the key is full")
	cancel(errFull)
	if _, err := g.Enter(full, "hot"); !errors.Is(err, errFull) {
		t.Fatalf("a third holder of a 2-place key: %v, want the context's cause", err)
	}
	// Every other key enters at once, whatever its hash.
	for i := range 1000 {
		leave, err := g.Enter(full, fmt.Sprintf("cold-%d", i))
		if err == nil {
			leave()
			continue
		}
		t.Fatalf("cold-%d waited behind the hot key: %v", i, err)
	}
	leaves[0]()
	leave, err := g.Enter(t.Context(), "hot")
	if err != nil {
		t.Fatal(err)
	}
	leave()
	leaves[1]()
}
