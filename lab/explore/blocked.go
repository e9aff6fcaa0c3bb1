package explore

import (
	"context"
	"database/sql"
	"strconv"
	"strings"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale/stock/internal/dburl"
	dbstore "github.com/flashsale/stock/internal/store"
)

// WaitObserver asks a database server, live, which sessions wait for a lock.
type WaitObserver struct {
	Blocked Blocked
	close   func()
}

// Close ends the observer's connections.
func (w *WaitObserver) Close() { w.close() }

// ObserveWaits connects to the server of databaseURL with a connection of
// its own. PostgreSQL answers from its lock manager (pg_blocking_pids);
// MariaDB and MySQL from InnoDB's live transaction list (SHOW ENGINE INNODB
// STATUS), not from information_schema.innodb_trx, which InnoDB serves
// from a cache up to 0.1 s old.
func ObserveWaits(ctx context.Context, databaseURL string) (*WaitObserver, error) {
	engine, err := dbstore.Engine(databaseURL)
	if err != nil {
		return nil, err
	}
	if engine == "postgres" {
		pool, err := pgxpool.New(ctx, databaseURL)
		if err != nil {
			return nil, err
		}
		return &WaitObserver{close: pool.Close, Blocked: func(ctx context.Context, pid int64) (bool, error) {
			var n int
			err := pool.QueryRow(ctx, `SELECT cardinality(pg_blocking_pids($1))`, pid).Scan(&n)
			return n > 0, err
		}}, nil
	}
	db, err := openMySQL(databaseURL)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return &WaitObserver{close: func() { _ = db.Close() }, Blocked: func(ctx context.Context, thread int64) (bool, error) {
		var typ, name, status string
		if err := db.QueryRowContext(ctx, `SHOW ENGINE INNODB STATUS`).Scan(&typ, &name, &status); err != nil {
			return false, err
		}
		return innodbWaits(status)[thread], nil
	}}, nil
}

// innodbWaits reads the threads whose transaction is in LOCK WAIT from the
// TRANSACTIONS section of SHOW ENGINE INNODB STATUS, where each transaction
// is a block that starts with "---TRANSACTION" and names its "MariaDB
// thread id" (or "MySQL thread id").
func innodbWaits(status string) map[int64]bool {
	waits := map[int64]bool{}
	for _, block := range strings.Split(status, "---TRANSACTION")[1:] {
		if !strings.Contains(block, "\nLOCK WAIT") {
			continue
		}
		for _, marker := range []string{"MariaDB thread id ", "MySQL thread id "} {
			i := strings.Index(block, marker)
			if i < 0 {
				continue
			}
			rest := block[i+len(marker):]
			if j := strings.IndexAny(rest, ", \n"); j > 0 {
				if id, err := strconv.ParseInt(rest[:j], 10, 64); err == nil {
					waits[id] = true
				}
			}
		}
	}
	return waits
}

// openMySQL opens a database/sql pool on a mysql:// DATABASE_URL, with the
// adapter's own reading of the URL.
func openMySQL(databaseURL string) (*sql.DB, error) {
	cfg, err := dburl.MySQL(databaseURL)
	if err != nil {
		return nil, err
	}
	connector, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(connector), nil
}
