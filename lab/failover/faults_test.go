package failover_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/faults"
)

// TestShortFailoverFaults runs the short forms of fault scenarios 15 and
// 16 (make faults runs the full ones, docs/faults.md): three instances of
// the service, built from cmd/stock, under load while PostgreSQL's primary
// under Patroni is killed, while the same happens on asynchronous
// replication with the standby lagging (the control, which must be caught
// losing orders answered 201), and while a Galera node is killed and
// restarted. Every order is audited and every history checked.
func TestShortFailoverFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real service processes and clusters")
	}
	// Not t.TempDir: its folders are closed to the postgres user, whom
	// Patroni's PostgreSQL runs as.
	dir, err := os.MkdirTemp("", "failover-faults-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	env := &faults.Env{Binary: serviceBinary(t), Dir: dir, Short: true, CheckTimeout: 5 * time.Second, Logf: t.Logf}
	ctx := context.Background()
	for _, c := range []struct {
		name string
		run  func() faults.Result
	}{
		{"15-patroni-kill", func() faults.Result {
			return env.PatroniFailover(ctx, strategies.NameConditional, faults.PrimaryKilled)
		}},
		// The run that found Patroni 3.0's etcd3 DCS handing the leader
		// key back to a woken primary (docs/replicated.md).
		{"15-patroni-freeze", func() faults.Result {
			return env.PatroniFailover(ctx, strategies.NameConditional, faults.PrimaryFrozen)
		}},
		{"15-patroni-async-control", func() faults.Result {
			return env.PatroniFailover(ctx, strategies.NameConditional, faults.AsyncLagging)
		}},
		{"16-galera-node-kill", func() faults.Result { return env.GaleraNodeKill(ctx, strategies.NameBatched) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			faults.Judge(t, c.run())
		})
	}
}

// serviceBinary is cmd/stock built for t.
func serviceBinary(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stock")
	if out, err := exec.Command("go", "build", "-o", path, "github.com/flashsale/stock/cmd/stock").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return path
}
