package faults

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/internal/mysqlconn"
	"github.com/flashsale/stock/lab/testredis"
)

// ErrMissing means a server binary this scenario needs is not installed.
var ErrMissing = errors.New("server binary not installed")

// redisNode is a redis-server of testredis (no persistence) that can be
// killed and restarted empty on its port.
type redisNode struct {
	Addr string
	dir  string
	port int
	srv  *testredis.Server
}

func startRedisNodes(n int) ([]*redisNode, error) {
	var nodes []*redisNode
	for range n {
		dir, err := os.MkdirTemp("", "faults-redis-")
		if err != nil {
			stopRedisNodes(nodes)
			return nil, err
		}
		srv, err := testredis.Spawn(dir, 0)
		if err != nil {
			_ = os.RemoveAll(dir)
			stopRedisNodes(nodes)
			if errors.Is(err, testredis.ErrNoRedis) {
				return nil, fmt.Errorf("%w: %w", ErrMissing, err)
			}
			return nil, err
		}
		_, port, _ := net.SplitHostPort(srv.Addr)
		p, _ := strconv.Atoi(port)
		nodes = append(nodes, &redisNode{Addr: srv.Addr, dir: dir, port: p, srv: srv})
	}
	return nodes, nil
}

// durableArgs make a redis-server fsync its append-only file before every
// answer.
var durableArgs = []string{"--appendonly", "yes", "--appendfsync", "always"}

// restartDurable starts a killed durable server again on its port, with
// its append-only file: everything it answered is back.
func (r *redisNode) restartDurable() error {
	srv, err := testredis.Spawn(r.dir, r.port, durableArgs...)
	if err != nil {
		return err
	}
	r.srv = srv
	return nil
}

// restartWiped starts a killed durable server again on its port with its
// data files deleted: a server that lost its disk, or a failover to an
// empty replica. It is as durable as before, with nothing in it.
func (r *redisNode) restartWiped() error {
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(r.dir, e.Name())); err != nil {
			return err
		}
	}
	return r.restartDurable()
}

// aofBytes is the size of the server's append-only files (Redis 7 keeps
// them in appendonlydir), 0 when it has none.
func (r *redisNode) aofBytes() int64 {
	var n int64
	_ = filepath.WalkDir(r.dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.Contains(d.Name(), ".aof") {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// startDurableRedisNode starts a redis-server that fsyncs its append-only
// file before every answer (redis-reserve, redis-watch).
func startDurableRedisNode() (*redisNode, error) {
	dir, err := os.MkdirTemp("", "faults-redis-")
	if err != nil {
		return nil, err
	}
	srv, err := testredis.Spawn(dir, 0, durableArgs...)
	if err != nil {
		_ = os.RemoveAll(dir)
		if errors.Is(err, testredis.ErrNoRedis) {
			return nil, fmt.Errorf("%w: %w", ErrMissing, err)
		}
		return nil, err
	}
	_, port, _ := net.SplitHostPort(srv.Addr)
	p, _ := strconv.Atoi(port)
	return &redisNode{Addr: srv.Addr, dir: dir, port: p, srv: srv}, nil
}

// kill crashes the server (SIGKILL by its PID).
func (r *redisNode) kill() { r.srv.Stop() }

// pause stops the server with SIGSTOP (by its PID): a hung server, which
// accepts connections and answers nothing. resume continues it.
func (r *redisNode) pause() error  { return r.srv.Pause() }
func (r *redisNode) resume() error { return r.srv.Resume() }

// restartEmpty starts the server again on the same port, with no data.
func (r *redisNode) restartEmpty() error {
	srv, err := testredis.Spawn(r.dir, r.port)
	if err != nil {
		return err
	}
	r.srv = srv
	return nil
}

func stopRedisNodes(nodes []*redisNode) {
	for _, r := range nodes {
		r.srv.Stop()
		_ = os.RemoveAll(r.dir)
	}
}

func redisAddrs(nodes []*redisNode) string {
	addrs := make([]string, len(nodes))
	for i, r := range nodes {
		addrs[i] = r.Addr
	}
	return strings.Join(addrs, ",")
}

// DBServer is a private PostgreSQL or MariaDB server run from the Debian
// binaries in a folder of its own, on a free loopback port: the scenarios
// crash and restart it, which they must never do to the machine's own
// servers. Close kills it and deletes its folder.
type DBServer struct {
	Engine string // "postgres" or "mysql"
	Addr   string
	dir    string
	p      *proc
}

// postgresBin finds the newest PostgreSQL server binaries of Debian.
func postgresBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) < pgVersion(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "postgres")); err == nil {
			return dirs[i], nil
		}
	}
	return "", fmt.Errorf("%w: no /usr/lib/postgresql/*/bin/postgres", ErrMissing)
}

func pgVersion(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// runAs returns the credential of a system user when we are root (the
// servers refuse to run as root, or drop to that user themselves), and the
// folder made over to it.
func runAs(name, dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("%w: user %s: %v", ErrMissing, name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// StartPostgres initialises a cluster in a new temporary folder and starts
// it; it answers as postgres without a password on 127.0.0.1.
func StartPostgres(ctx context.Context) (*DBServer, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "faults-postgres-")
	if err != nil {
		return nil, err
	}
	s := &DBServer{Engine: "postgres", dir: dir}
	fail := func(err error) (*DBServer, error) { s.Close(); return nil, err }
	if err := os.Chmod(dir, 0o755); err != nil {
		return fail(err)
	}
	cred, err := runAs("postgres", dir)
	if err != nil {
		return fail(err)
	}
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"),
		"-U", "postgres", "--auth=trust", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %v\n%s", err, out))
	}
	addr, err := freeAddr()
	if err != nil {
		return fail(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	s.Addr = addr
	// fsync stays on (the default): a crash must keep committed orders.
	s.p = &proc{
		name: "postgres", path: filepath.Join(bin, "postgres"), cred: cred, group: true,
		args: []string{"-D", filepath.Join(dir, "data"), "-c", "listen_addresses=127.0.0.1", "-c", "port=" + port,
			"-c", "unix_socket_directories=" + dir, "-c", "max_connections=300", "-c", "shared_buffers=64MB"},
		logPath: filepath.Join(dir, "postgres.log"),
	}
	if err := s.Start(ctx); err != nil {
		return fail(err)
	}
	return s, nil
}

// StartMariaDB initialises a data folder in a new temporary folder and
// starts mariadbd; it answers as root without a password on 127.0.0.1.
func StartMariaDB(ctx context.Context) (*DBServer, error) {
	for _, b := range []string{"mariadbd", "mariadb-install-db"} {
		if _, err := exec.LookPath(b); err != nil {
			if _, err2 := os.Stat("/usr/sbin/" + b); err2 != nil {
				return nil, fmt.Errorf("%w: %s: %v", ErrMissing, b, err)
			}
		}
	}
	dir, err := os.MkdirTemp("", "faults-mariadb-")
	if err != nil {
		return nil, err
	}
	s := &DBServer{Engine: "mysql", dir: dir}
	fail := func(err error) (*DBServer, error) { s.Close(); return nil, err }
	if err := os.Chmod(dir, 0o755); err != nil {
		return fail(err)
	}
	var userArgs []string
	if os.Geteuid() == 0 {
		// mariadbd drops to this user itself; the socket folder must be its.
		if _, err := runAs("mysql", dir); err != nil {
			return fail(err)
		}
		userArgs = []string{"--user=mysql"}
	}
	data := filepath.Join(dir, "data")
	install := exec.CommandContext(ctx, lookSbin("mariadb-install-db"), append(userArgs, "--datadir="+data,
		"--auth-root-authentication-method=normal", "--skip-test-db")...)
	if out, err := install.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("mariadb-install-db: %v\n%s", err, out))
	}
	addr, err := freeAddr()
	if err != nil {
		return fail(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	s.Addr = addr
	// --no-defaults: none of the machine's configuration; InnoDB flushes
	// its log at every commit by default, so a crash keeps committed orders.
	s.p = &proc{
		name: "mariadbd", path: lookSbin("mariadbd"), group: true,
		args: append([]string{"--no-defaults"}, append(userArgs, "--datadir="+data, "--port="+port,
			"--bind-address=127.0.0.1", "--socket="+filepath.Join(dir, "mysqld.sock"),
			"--pid-file="+filepath.Join(dir, "mysqld.pid"), "--max-connections=300", "--skip-name-resolve")...),
		logPath: filepath.Join(dir, "mariadbd.log"),
	}
	if err := s.Start(ctx); err != nil {
		return fail(err)
	}
	return s, nil
}

func lookSbin(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return "/usr/sbin/" + name
}

// adminURL is a URL of the server's administrative database.
func (s *DBServer) adminURL() string {
	if s.Engine == "postgres" {
		return "postgres://postgres@" + s.Addr + "/postgres?sslmode=disable&connect_timeout=2"
	}
	return "mysql://root@" + s.Addr + "/mysql?timeout=2s"
}

// Start starts the (stopped or crashed) server and waits until it accepts
// queries, crash recovery included.
func (s *DBServer) Start(ctx context.Context) error {
	if err := s.p.start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	exited := s.p.exitedC()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		err := ping(ctx, s.adminURL())
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited while starting: %v\n%s", s.p.name, err, s.p.tail(3000))
		case <-ctx.Done():
			return fmt.Errorf("%s does not answer: %v\n%s", s.p.name, err, s.p.tail(3000))
		case <-t.C:
		}
	}
}

// Crash kills the server with SIGKILL (every process of its group) and
// waits until it is gone. Start brings it back through crash recovery.
func (s *DBServer) Crash() error { return s.p.kill() }

// Close kills the server and deletes its folder.
func (s *DBServer) Close() {
	if s.p != nil {
		_ = s.p.kill()
	}
	_ = os.RemoveAll(s.dir)
}

// NewDatabase creates an empty database named name and returns its
// DATABASE_URL.
func (s *DBServer) NewDatabase(ctx context.Context, name string) (string, error) {
	if err := execAdmin(ctx, s.adminURL(), "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	if s.Engine == "postgres" {
		return "postgres://postgres@" + s.Addr + "/" + name + "?sslmode=disable", nil
	}
	return "mysql://root@" + s.Addr + "/" + name, nil
}

// ping checks that a database answers a query.
func ping(ctx context.Context, rawURL string) error {
	return execAdmin(ctx, rawURL, "SELECT 1")
}

// execAdmin runs one statement on a fresh connection.
func execAdmin(ctx context.Context, rawURL, stmt string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if strings.HasPrefix(rawURL, "postgres") {
		conn, err := pgx.Connect(ctx, rawURL)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		_, err = conn.Exec(ctx, stmt)
		return err
	}
	db, err := openMySQL(rawURL)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, stmt)
	return err
}

// openMySQL is a pool on rawURL's server, or on the first node that serves
// of a Galera cluster when it names several (as the service reaches them).
func openMySQL(rawURL string) (*sql.DB, error) {
	cfg, hosts, err := dburl.MySQLNodes(rawURL)
	if err != nil {
		return nil, err
	}
	var connector driver.Connector
	if len(hosts) > 1 {
		connector, err = mysqlconn.New(cfg, hosts)
	} else {
		connector, err = gomysql.NewConnector(cfg)
	}
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(connector), nil
}

// engineOf returns "postgres" or "mysql" for a DATABASE_URL.
func engineOf(rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil && u.Scheme == "mysql" {
		return "mysql"
	}
	return "postgres"
}
