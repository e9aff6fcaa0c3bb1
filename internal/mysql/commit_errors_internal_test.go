package mysql

import (
	"context"
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/flashsale/stock/internal/inventory"
)

// At COMMIT only a deadlock (on Galera, a failed certification) and a
// changed snapshot say the transaction was rolled back: they are run
// again. Any other refusal there may come after the write set left for
// the cluster, and is an unknown outcome, which a lookup settles, never a
// "nothing was deducted".
func TestOnlyADeadlockOrAChangedSnapshotAtCommitMeansRolledBack(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		number uint16
		want   error
	}{
		{erLockDeadlock, inventory.ErrConflict},
		{erCheckRead, inventory.ErrConflict},
		{erWsrepNotReady, inventory.ErrOutcomeUnknown},
		{1180, inventory.ErrOutcomeUnknown}, // "Got error during COMMIT": a replication failure
		{erServerShutdown, inventory.ErrOutcomeUnknown},
		{erLockWaitTimeout, inventory.ErrOutcomeUnknown},
	} {
		err := wrapCommit(ctx, &mysql.MySQLError{Number: c.number, Message: "at commit"})
		if !errors.Is(err, c.want) {
			t.Errorf("error %d at COMMIT: %v, want %v", c.number, err, c.want)
		}
		if c.want == inventory.ErrConflict && errors.Is(err, inventory.ErrOutcomeUnknown) {
			t.Errorf("error %d at COMMIT is rolled back, yet answered as an unknown outcome: %v", c.number, err)
		}
	}
}
