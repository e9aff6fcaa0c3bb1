// Package testdb gives each test a database of its own on the real servers:
// a fresh schema in PostgreSQL, a fresh database in MySQL/MariaDB, migrated
// and dropped again when the test ends.
//
// The servers are found through TEST_POSTGRES_URL (default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable) and
// TEST_MYSQL_URL (default mysql://root@127.0.0.1:3306/mysql). A server that
// does not answer skips the test, except under CI=true, where it fails it:
// CI must never pass because a server was missing.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/mysqlconn"
	"github.com/flashsale/stock/internal/store"
)

// DefaultPostgresURL and DefaultMySQLURL are the local servers of a
// development machine.
const (
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	DefaultMySQLURL    = "mysql://root@127.0.0.1:3306/mysql"
)

func serverURL(env, def string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}

// unavailable skips the test, or fails it under CI.
func unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("CI=true and "+format, args...)
	}
	tb.Skipf(format+" (set CI=true to make this a failure)", args...)
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// URL creates an empty database for the engine ("postgres" or "mysql") and
// returns a DATABASE_URL that points at it. The database is dropped when the
// test ends.
func URL(tb testing.TB, engine string) string {
	tb.Helper()
	switch engine {
	case "postgres":
		return postgresURL(tb)
	case "mysql":
		return mysqlURL(tb)
	}
	tb.Fatalf("testdb: unknown engine %q", engine)
	return ""
}

func postgresURL(tb testing.TB) string {
	tb.Helper()
	base := serverURL("TEST_POSTGRES_URL", DefaultPostgresURL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		unavailable(tb, "PostgreSQL at %s does not answer: %v", base, err)
	}
	defer conn.Close(ctx)
	schema := randomName("stock_test_")
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		tb.Fatalf("create schema: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			tb.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			tb.Errorf("drop schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		tb.Fatalf("TEST_POSTGRES_URL: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

func mysqlURL(tb testing.TB) string {
	tb.Helper()
	return MySQLURLOn(tb, serverURL("TEST_MYSQL_URL", DefaultMySQLURL))
}

// MySQLURLOn creates an empty database on the MySQL-protocol server of
// base and returns base naming it, dropped when the test ends. With
// several hosts (a Galera cluster) it goes through the first node that
// serves, as the service does: the others get the database by replication,
// and the drop still reaches the cluster after a test killed a node.
func MySQLURLOn(tb testing.TB, base string) string {
	tb.Helper()
	cfg, hosts, err := dburl.MySQLNodes(base)
	if err != nil {
		tb.Fatalf("%s: %v", base, err)
	}
	var connector driver.Connector
	if len(hosts) > 1 {
		connector, err = mysqlconn.New(cfg, hosts)
	} else {
		connector, err = gomysql.NewConnector(cfg)
	}
	if err != nil {
		tb.Fatalf("%s: %v", base, err)
	}
	db := sql.OpenDB(connector)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		unavailable(tb, "MySQL/MariaDB at %s does not answer: %v", cfg.Addr, err)
	}
	name := randomName("stock_test_")
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		_ = db.Close()
		tb.Fatalf("create database: %v", err)
	}
	tb.Cleanup(func() {
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, "DROP DATABASE "+name); err != nil {
			tb.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		tb.Fatalf("TEST_MYSQL_URL: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

// New returns a migrated store on a fresh database of the engine, closed
// when the test ends.
func New(tb testing.TB, engine string, maxConns int) store.Store {
	tb.Helper()
	url := URL(tb, engine)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := store.Open(ctx, url, maxConns)
	if err != nil {
		tb.Fatalf("open %s: %v", engine, err)
	}
	tb.Cleanup(s.Close)
	if err := s.Migrate(ctx); err != nil {
		tb.Fatalf("migrate %s: %v", engine, err)
	}
	return s
}

// MigratedURL returns the DATABASE_URL of a fresh, migrated database of the
// engine, dropped when the test ends: for a test that opens its own
// connections to it (a lock table's, through a proxy).
func MigratedURL(tb testing.TB, engine string) string {
	tb.Helper()
	url := URL(tb, engine)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := store.Open(ctx, url, 4)
	if err != nil {
		tb.Fatalf("open %s: %v", engine, err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		tb.Fatalf("migrate %s: %v", engine, err)
	}
	return url
}

// errReleased ends a HoldRow transaction: it rolls back.
var errReleased = errors.New("testdb: row released")

// HoldRow locks sku's stock row (SELECT … FOR UPDATE) in a transaction of
// its own, as a client that holds the row and does nothing would, and
// returns once the lock is held. release rolls the transaction back and
// reports anything but that rollback; it runs at the test's end too.
func HoldRow(tb testing.TB, db inventory.Store, sku string) (release func() error) {
	tb.Helper()
	locked, done := make(chan struct{}), make(chan struct{})
	ended := make(chan error, 1)
	go func() {
		ended <- db.InTx(context.Background(), func(ctx context.Context, tx inventory.Tx) error {
			if _, err := tx.LockLevel(ctx, sku); err != nil {
				return err
			}
			close(locked)
			<-done
			return errReleased
		})
	}()
	select {
	case <-locked:
	case err := <-ended:
		tb.Fatalf("hold the row of %q: %v", sku, err)
	}
	var once sync.Once
	var result error
	release = func() error {
		once.Do(func() {
			close(done)
			if err := <-ended; !errors.Is(err, errReleased) {
				result = fmt.Errorf("the transaction holding %q ended with %v, not its rollback", sku, err)
			}
		})
		return result
	}
	tb.Cleanup(func() { _ = release() })
	return release
}
