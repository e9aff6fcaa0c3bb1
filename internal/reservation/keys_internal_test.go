package reservation

import (
	"slices"
	"testing"
)

// TestReserveKeysAreTheSKUsKeys: the reserve script's keys, built alone for
// every order, name the same keys as keys and placedKey.
func TestReserveKeysAreTheSKUsKeys(t *testing.T) {
	s := &Store{prefix: "stock:"}
	k := s.keys("sku-1")
	want := []string{k.sale, k.idem, k.orders, s.placedKey("sku-1", "order-1"), k.buyers}
	if got := s.reserveKeys("sku-1", "order-1"); !slices.Equal(got, want) {
		t.Fatalf("reserveKeys = %q, want %q", got, want)
	}
}
