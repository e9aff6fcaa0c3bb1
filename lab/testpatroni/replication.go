package testpatroni

// A member's replication: waited for, and frozen by stopping the
// processes that carry WAL to it, by their PIDs.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// frozenProc is a process FreezeReplication stopped, with its start time
// (field 22 of /proc/<pid>/stat): a PID reused since is not continued.
type frozenProc struct {
	pid   int
	start string
}

// FreezeReplication stops WAL on its way to m, a running replica, until
// ThawReplication: it stops (SIGSTOP) the primary's walsender that streams
// to m, so that nothing more is sent to m, and m's walreceiver, so that m
// neither writes nor acknowledges what reached it before. A commit that
// waits for m as its synchronous standby waits until the thaw. Both
// processes stay in pg_stat_replication and pg_stat_wal_receiver, so
// Patroni still sees m streaming, and as the synchronous standby, for as
// long as neither side's timeout ends the connection (wal_sender_timeout,
// wal_receiver_timeout: 60 s).
//
// Stopping the walreceiver alone is not enough to keep WAL from m: the
// kernel goes on buffering what the walsender sends (up to the socket
// buffers' size), and a walreceiver continued after the primary's death
// still reads and writes it: an asynchronous standby frozen that way lost
// none of 20 commits.
func (m *Member) FreezeReplication(ctx context.Context) error {
	m.mu.Lock()
	already := len(m.frozen) > 0
	m.mu.Unlock()
	if already {
		return fmt.Errorf("testpatroni: %s: replication already frozen", m.Name)
	}
	primary, err := m.c.Primary(ctx)
	if err != nil {
		return fmt.Errorf("testpatroni: freeze %s: %w", m.Name, err)
	}
	if primary == m {
		return fmt.Errorf("testpatroni: freeze %s: it is the primary", m.Name)
	}
	sender, err := queryPID(ctx, primary, `SELECT pid FROM pg_stat_replication WHERE application_name = $1`, m.Name)
	if err != nil {
		return fmt.Errorf("testpatroni: freeze %s: its walsender on %s: %w", m.Name, primary.Name, err)
	}
	receiver, err := queryPID(ctx, m, `SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'`)
	if err != nil {
		return fmt.Errorf("testpatroni: freeze %s: its walreceiver: %w", m.Name, err)
	}
	var frozen []frozenProc
	for _, pid := range []int{sender, receiver} {
		start := procStart(pid)
		if start == "" {
			err = fmt.Errorf("process %d is gone", pid)
		} else {
			err = syscall.Kill(pid, syscall.SIGSTOP)
		}
		if err != nil {
			thaw(frozen)
			return fmt.Errorf("testpatroni: freeze %s: stop %d: %w", m.Name, pid, err)
		}
		frozen = append(frozen, frozenProc{pid, start})
	}
	m.mu.Lock()
	m.frozen = frozen
	m.mu.Unlock()
	return nil
}

// ThawReplication continues what FreezeReplication stopped, those of its
// processes that still run (a killed primary's walsender does not). It is
// idempotent.
func (m *Member) ThawReplication() {
	m.mu.Lock()
	frozen := m.frozen
	m.frozen = nil
	m.mu.Unlock()
	thaw(frozen)
}

func thaw(frozen []frozenProc) {
	for _, p := range frozen {
		if procStart(p.pid) == p.start {
			_ = syscall.Kill(p.pid, syscall.SIGCONT)
		}
	}
}

// CatchUp waits, within ctx, until m, a replica, has replayed all the WAL
// the primary had written when CatchUp was called: what was committed
// before is then readable on m, and m has it should it be promoted.
func (m *Member) CatchUp(ctx context.Context) error {
	primary, err := m.c.Primary(ctx)
	if err != nil {
		return fmt.Errorf("testpatroni: catch up %s: %w", m.Name, err)
	}
	var lsn string
	if err := queryRow(ctx, primary, `SELECT pg_current_wal_lsn()::text`, nil, &lsn); err != nil {
		return fmt.Errorf("testpatroni: catch up %s: the primary's position: %w", m.Name, err)
	}
	conn, err := pgx.Connect(ctx, m.URL("postgres"))
	if err != nil {
		return fmt.Errorf("testpatroni: catch up %s: %w", m.Name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var replayed bool
		err := conn.QueryRow(ctx, `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, lsn).Scan(&replayed)
		if err == nil && replayed {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("testpatroni: %s has not replayed up to %s (%v): %w", m.Name, lsn, err, context.Cause(ctx))
		}
	}
}

// queryRow scans the one row query returns on m, connected to m alone.
func queryRow(ctx context.Context, m *Member, query string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, m.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, query, args...).Scan(dest...)
}

// queryPID is the one PID query returns on m, connected to m alone.
func queryPID(ctx context.Context, m *Member, query string, args ...any) (int, error) {
	var pid int
	err := queryRow(ctx, m, query, args, &pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, errors.New("no such process (not streaming?)")
	}
	return pid, err
}

// procStart is a process's start time, in clock ticks after boot, "" when
// it has no process (or only a zombie).
func procStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	i := bytes.LastIndexByte(b, ')')
	if err != nil || i < 0 {
		return ""
	}
	// After "pid (comm)": state is field 3, starttime field 22.
	fields := bytes.Fields(b[i+1:])
	if len(fields) < 20 || fields[0][0] == 'Z' {
		return ""
	}
	return string(fields[19])
}

// CreateDatabase creates the database name on the primary and waits until
// every running replica has replayed it, then returns the cluster's URL of
// it. The wait matters: a synchronous commit returns once a standby has
// the WAL, not once it has replayed it, and pgx tries no further host
// after one that says the database does not exist (3D000).
func (c *Cluster) CreateDatabase(ctx context.Context, name string) (string, error) {
	primary, err := c.Primary(ctx)
	if err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, primary.URL("postgres"))
	if err != nil {
		return "", fmt.Errorf("testpatroni: create database %s: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("testpatroni: create database %s: %w", name, err)
	}
	for _, m := range c.Members {
		if m != primary && m.Running() {
			if err := m.CatchUp(ctx); err != nil {
				return "", err
			}
		}
	}
	return c.URL(name), nil
}
