package inventorylock

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/locking"
)

func TestLockErrorClassification(t *testing.T) {
	down := &locking.NodeError{Node: "127.0.0.1:1", Err: errors.New("connection refused")}
	slow := &locking.NodeError{Node: "127.0.0.1:2", Err: fmt.Errorf("i/o: %w", context.DeadlineExceeded)}
	cases := []struct {
		err  error
		want error
	}{
		{errors.Join(locking.ErrNotObtained, context.DeadlineExceeded), inventory.ErrBusy},
		{errors.Join(locking.ErrNotObtained, context.DeadlineExceeded, slow), inventory.ErrBusy},
		{errors.Join(locking.ErrNotObtained, context.DeadlineExceeded, slow, down), inventory.ErrUnavailable},
		{errors.Join(locking.ErrNotObtained, fmt.Errorf("round: %w", errors.Join(slow, down))), inventory.ErrUnavailable},
	}
	for _, c := range cases {
		if got := AcquireError(c.err); !errors.Is(got, c.want) {
			t.Errorf("%v: filed as %v, want %v", c.err, got, c.want)
		}
	}
}
