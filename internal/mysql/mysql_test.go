package mysql_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/internal/mysql"
	"github.com/flashsale/stock/lab/testdb"
)

// TestClientFoundRowsIsRefused: with clientFoundRows the server reports the
// rows an UPDATE matched, so the idempotency insert's no-op update of a key
// that another order took would count as inserted and the key would deduct
// twice. Every spelling the driver reads as true is refused, by dburl.MySQL and
// so by Open, with a message that names the parameter; false is accepted.
func TestClientFoundRowsIsRefused(t *testing.T) {
	for _, v := range []string{"true", "1", "TRUE", "True"} {
		_, err := dburl.MySQL("mysql://root@127.0.0.1:3306/stock?clientFoundRows=" + v)
		if err == nil || !strings.Contains(err.Error(), "clientFoundRows") {
			t.Errorf("clientFoundRows=%s: %v, want a refusal naming the parameter", v, err)
		}
	}
	for _, v := range []string{"false", "0"} {
		cfg, err := dburl.MySQL("mysql://root@127.0.0.1:3306/stock?clientFoundRows=" + v)
		if err != nil || cfg.ClientFoundRows {
			t.Errorf("clientFoundRows=%s: %v, want it accepted", v, err)
		}
	}

	url := testdb.URL(t, "mysql")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := mysql.Open(ctx, url+"?clientFoundRows=true")
	if err == nil {
		s.Close()
		t.Fatal("Open accepted clientFoundRows=true")
	}
	if !strings.Contains(err.Error(), "clientFoundRows") {
		t.Errorf("Open: %v, want a message naming clientFoundRows", err)
	}
}
