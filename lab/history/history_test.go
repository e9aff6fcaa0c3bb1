package history

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func check(t *testing.T, initial int64, ops ...Op) porcupine.CheckResult {
	t.Helper()
	for i := range ops {
		ops[i].SKU = "s"
		ops[i].Client = i
	}
	v, err := Check(ops, map[string]int64{"s": initial}, 10*time.Second, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 1 {
		t.Fatalf("%d verdicts", len(v))
	}
	return v[0].Result
}

func TestSequential(t *testing.T) {
	got := check(t, 3,
		Op{Quantity: 2, Call: 0, Return: 10, Outcome: OK},
		Op{Quantity: 2, Call: 20, Return: 30, Outcome: SoldOut},
		Op{Quantity: 1, Call: 40, Return: 50, Outcome: OK},
		Op{Quantity: 1, Call: 60, Return: 70, Outcome: SoldOut},
	)
	if got != porcupine.Ok {
		t.Errorf("a correct sequential sale: %s", got)
	}
}

func TestOversellIsIllegal(t *testing.T) {
	got := check(t, 1,
		Op{Quantity: 1, Call: 0, Return: 10, Outcome: OK},
		Op{Quantity: 1, Call: 5, Return: 15, Outcome: OK},
	)
	if got != porcupine.Illegal {
		t.Errorf("two units sold from one: %s", got)
	}
}

func TestFalseSoldOutIsIllegal(t *testing.T) {
	got := check(t, 5,
		Op{Quantity: 1, Call: 0, Return: 10, Outcome: SoldOut},
	)
	if got != porcupine.Illegal {
		t.Errorf("sold out with stock left: %s", got)
	}
}

func TestConcurrentOrderMatters(t *testing.T) {
	// Overlapping: the 2 went first, then the 1 was sold out. Linearizable.
	got := check(t, 2,
		Op{Quantity: 1, Call: 0, Return: 20, Outcome: SoldOut},
		Op{Quantity: 2, Call: 5, Return: 15, Outcome: OK},
	)
	if got != porcupine.Ok {
		t.Errorf("overlapping orders that fit one order: %s", got)
	}
	// Not overlapping: the sold-out came first, while 2 were left.
	got = check(t, 2,
		Op{Quantity: 1, Call: 0, Return: 4, Outcome: SoldOut},
		Op{Quantity: 2, Call: 5, Return: 15, Outcome: OK},
	)
	if got != porcupine.Illegal {
		t.Errorf("sold out before the stock went: %s", got)
	}
}

func TestUnknownMayOrMayNotHaveHappened(t *testing.T) {
	// It did not happen.
	if got := check(t, 1,
		Op{Quantity: 1, Call: 0, Return: 5, Outcome: Unknown},
		Op{Quantity: 1, Call: 10, Return: 20, Outcome: OK},
	); got != porcupine.Ok {
		t.Errorf("unknown that did not happen: %s", got)
	}
	// It happened, even after its client gave up.
	if got := check(t, 1,
		Op{Quantity: 1, Call: 0, Return: 5, Outcome: Unknown},
		Op{Quantity: 1, Call: 10, Return: 20, Outcome: SoldOut},
	); got != porcupine.Ok {
		t.Errorf("unknown that happened: %s", got)
	}
	// Either way no more than the stock is sold.
	if got := check(t, 1,
		Op{Quantity: 1, Call: 0, Return: 5, Outcome: Unknown},
		Op{Quantity: 1, Call: 10, Return: 20, Outcome: OK},
		Op{Quantity: 1, Call: 30, Return: 40, Outcome: OK},
	); got != porcupine.Illegal {
		t.Errorf("two sold from one, with an unknown beside: %s", got)
	}
}

func TestRecorderAndVisualization(t *testing.T) {
	r := NewRecorder()
	done := r.Begin(0, "s", 1)
	done(OK)
	done = r.Begin(1, "s", 1)
	done(OK)
	dir := t.TempDir()
	v, err := Check(r.Ops(), map[string]int64{"s": 1}, time.Second, dir)
	if err != nil {
		t.Fatal(err)
	}
	if v[0].Linearizable() || v[0].Visualization == "" {
		t.Fatalf("verdict %v: want illegal with a visualization", v[0])
	}
	if _, err := Check(r.Ops(), map[string]int64{}, time.Second, ""); err == nil {
		t.Error("a SKU without initial stock must be an error")
	}
}
