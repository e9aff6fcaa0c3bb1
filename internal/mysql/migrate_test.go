package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/internal/mysql"
	"github.com/flashsale/stock/lab/testdb"
)

// Instances that start together on the nodes of a Galera cluster can meet
// half-way: one finds the version table another has created and not yet
// given its first row, and goose fails ("missing zero version migration":
// the demo's failover run had an instance exit so). Migrate tries again.
// Here the other instance is a session that created the table and holds
// its first row uncommitted until Migrate's first attempt has failed and
// let go of the migration lock.
func TestAMigrationThatMeetsAnotherHalfWayIsTriedAgain(t *testing.T) {
	url := testdb.URL(t, "mysql")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := dburl.MySQL(url)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.ExecContext(ctx, `CREATE TABLE goose_db_version (
		id bigint(20) unsigned NOT NULL AUTO_INCREMENT, version_id bigint NOT NULL,
		is_applied boolean NOT NULL, tstamp datetime NULL default CURRENT_TIMESTAMP, PRIMARY KEY(id))`); err != nil {
		t.Fatal(err)
	}
	other, err := raw.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback() }()
	if _, err := other.ExecContext(ctx, `INSERT INTO goose_db_version (version_id, is_applied) VALUES (0, true)`); err != nil {
		t.Fatal(err)
	}

	s, err := mysql.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	done := make(chan error, 1)
	go func() { done <- s.Migrate(ctx) }()

	// The lock row exists unlocked only once an attempt has let go of it.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for released := false; !released; {
		select {
		case err := <-done:
			t.Fatalf("Migrate ended (%v) before the other instance's first row was committed: it gave up at its first attempt", err)
		case <-tick.C:
		}
		var locked bool
		err := raw.QueryRowContext(ctx, `SELECT locked FROM goose_lock`).Scan(&locked)
		switch {
		case err == nil:
			released = !locked
		case !errors.Is(err, sql.ErrNoRows) && ctx.Err() == nil:
			var missing bool // the lock table is created by the first attempt
			if raw.QueryRowContext(ctx, `SELECT COUNT(*) = 0 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'goose_lock'`).Scan(&missing); !missing {
				t.Fatalf("read the migration lock: %v", err)
			}
		case ctx.Err() != nil:
			t.Fatal("Migrate's first attempt did not end within 30 s")
		}
	}
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Migrate once the other instance's first row is there: %v", err)
	}
	var stock int
	if err := raw.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'stock'`).Scan(&stock); err != nil || stock != 1 {
		t.Errorf("the stock table after Migrate: %d (%v), want it created", stock, err)
	}
}
