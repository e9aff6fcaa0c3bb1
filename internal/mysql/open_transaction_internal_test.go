package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// refusingConn is a driver connection whose server refuses COMMIT and
// ROLLBACK as a Galera node that left the majority does (1047), leaving
// the transaction open on it.
type refusingConn struct {
	closed *atomic.Int32
	commit error
}

func (c *refusingConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("not used") }
func (c *refusingConn) Close() error                        { c.closed.Add(1); return nil }
func (c *refusingConn) Begin() (driver.Tx, error)           { return c, nil }
func (c *refusingConn) Commit() error                       { return c.commit }
func (c *refusingConn) Rollback() error                     { return &mysql.MySQLError{Number: erWsrepNotReady} }
func (c *refusingConn) ExecContext(context.Context, string, []driver.NamedValue) (driver.Result, error) {
	return driver.RowsAffected(0), nil
}

type refusingConnector struct {
	closed *atomic.Int32
	commit error
}

func (c refusingConnector) Connect(context.Context) (driver.Conn, error) {
	return &refusingConn{closed: c.closed, commit: c.commit}, nil
}
func (c refusingConnector) Driver() driver.Driver { return nil }

// A connection on which a transaction may still be open, because the
// server refused its COMMIT with anything but a known rollback (or its
// ROLLBACK), is closed, never handed to the next transaction: its BEGIN
// would commit the old one. One refused with a deadlock (rolled back) is
// kept.
func TestAConnectionWhoseTransactionMayStillBeOpenIsClosed(t *testing.T) {
	for _, c := range []struct {
		commit error
		closed bool
	}{
		{&mysql.MySQLError{Number: erWsrepNotReady}, true},
		{&mysql.MySQLError{Number: 1180}, true},
		{&mysql.MySQLError{Number: erLockDeadlock}, false},
	} {
		var closed atomic.Int32
		db := sql.OpenDB(refusingConnector{closed: &closed, commit: c.commit})
		s := &Store{db: db}
		err := s.inTx(context.Background(), func(context.Context, *tx) error { return nil })
		if err == nil {
			t.Fatalf("COMMIT refused with %v: no error", c.commit)
		}
		if got := closed.Load() == 1; got != c.closed {
			t.Errorf("COMMIT refused with %v: connection closed %v, want %v", c.commit, got, c.closed)
		}
		_ = db.Close()
	}
}
