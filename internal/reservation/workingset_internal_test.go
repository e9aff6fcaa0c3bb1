package reservation

import (
	"fmt"
	"testing"
)

// TestWorkingSetTakesStreamsInTurn: rounds of the working set take its
// streams in turn, at most a round's worth each, skip the ones that left,
// and the line stays the size of the set however often SKUs come and go.
func TestWorkingSetTakesStreamsInTurn(t *testing.T) {
	w := &workingSet{byKey: map[string]*stream{}}
	for i := range 600 {
		w.add(fmt.Sprintf("s%03d", i), false)
	}
	seen := map[string]int{}
	for range 3 {
		round := w.next(roundSKUs)
		if len(round) > roundSKUs {
			t.Fatalf("a round of %d streams, want at most %d", len(round), roundSKUs)
		}
		for _, st := range round {
			seen[st.sku]++
		}
	}
	if len(seen) != 600 {
		t.Fatalf("three rounds of %d took %d distinct streams of 600", roundSKUs, len(seen))
	}
	for _, st := range w.next(600) {
		if st.sku < "s300" {
			w.remove(st)
		}
	}
	for range 1000 { // SKUs that come and go
		w.add("churn", false)
		w.remove(w.byKey["churn"])
		w.next(roundSKUs)
	}
	for _, st := range w.next(600) {
		if st.sku < "s300" || st.sku == "churn" {
			t.Fatalf("stream %s taken after it left the set", st.sku)
		}
	}
	if len(w.byKey) != 300 || len(w.turn) > 2*len(w.byKey)+roundSKUs {
		t.Fatalf("%d streams in the set, %d in line", len(w.byKey), len(w.turn))
	}
}
