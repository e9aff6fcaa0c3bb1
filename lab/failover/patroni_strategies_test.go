package failover_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testpatroni"
)

// The same race as TestConformance, on PostgreSQL under Patroni with a
// synchronous standby, through two instances that reach the primary by
// the multi-host URL (target_session_attrs=read-write), as a deployment
// would: every safe strategy sells exactly the stock, with linearizable
// answers, while each commit waits for the standby.
func TestEverySafeStrategySellsExactlyItsStockOnPostgreSQLUnderPatroni(t *testing.T) {
	const initial, buyers = 50, 200
	c := testpatroni.Start(t, testpatroni.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for _, e := range strategies.All() {
		if strategies.IsControl(e.Name) {
			continue
		}
		t.Run(e.Name, func(t *testing.T) {
			name := patroniDatabase(ctx, t, c)
			url := c.URL(name)
			sellsExactlyThrough(t, e, []store.Store{openPatroni(ctx, t, c, name, 16), openPatroni(ctx, t, c, name, 16)},
				[]string{url, url}, initial, buyers)
		})
	}
}
