// Package testpatroni runs a private PostgreSQL 15 cluster under Patroni
// (Debian's patroni package) for tests: two or more members on free
// 127.0.0.1 ports with trust authentication, synchronous replication by
// default, and a private etcd (lab/testetcd) as Patroni's DCS. Members are
// killed and restarted by their own PIDs; it never touches a PostgreSQL or
// etcd it did not start.
//
// Patroni keeps its leader key in etcd through the v2 API (the etcd DCS),
// not the v3 one (etcd3). Patroni 3.0's etcd3 code renews a leader key
// with a plain put from its cached view of the cluster: a primary frozen
// past the ttl that wakes before that view is refreshed takes the key back
// from the standby promoted meanwhile, which is then demoted at once, and
// the orders it answered 201 in between are gone (fault scenario 15 found
// it: seven orders lost). The etcd DCS renews with a compare-and-swap on
// the key's value, which a deposed primary cannot win.
//
// The leader key lives 10 s (ttl), so a killed primary is replaced in
// about that time. Patroni 3.0 accepts that ttl; 3.1 and later raise any
// ttl under 20 to 20, which would double the failover time.
//
// PostgreSQL refuses to run as root: under root, Patroni and its
// PostgreSQL run as the postgres user, which must be able to reach the
// cluster's folder.
//
// Without patroni, the PostgreSQL binaries or etcd a test skips, except
// under CI=true, where it fails: CI must never pass because a server was
// missing.
package testpatroni

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale/stock/lab/testetcd"
	"github.com/flashsale/stock/lab/testproc"
)

const (
	// Bin is where Debian's patroni package puts Patroni.
	Bin = "/usr/bin/patroni"
	// BinDir holds Debian's PostgreSQL 15 server binaries.
	BinDir = "/usr/lib/postgresql/15/bin"
	// readyWithin bounds a wait given no deadline: two members are ready
	// in about 10 s on two cores.
	readyWithin = 90 * time.Second
)

// ErrNoPatroni means patroni, the PostgreSQL binaries or etcd are missing.
var ErrNoPatroni = errors.New("patroni, PostgreSQL 15 or etcd not found (apt-get install patroni postgresql-15 etcd-server)")

// Options are the settings of a cluster. The zero value is two members
// with synchronous replication, their output kept in memory only.
type Options struct {
	// Members is how many members the cluster has; 2 by default.
	Members int
	// Async turns synchronous replication off; false (the default) runs
	// Patroni with synchronous_mode: true and synchronous_mode_strict:
	// false, so that a commit waits for the synchronous standby, and the
	// primary keeps accepting writes once no standby is left.
	Async bool
	// LogDir, when set, receives each member's output (Patroni's and its
	// PostgreSQL's) in a file of its own, <name>.log, appended; "" (the
	// default) keeps only the last 64 KiB of it in memory, for errors.
	LogDir string
}

// Cluster is the members of one Patroni cluster and their etcd.
type Cluster struct {
	Members []*Member
	Etcd    *testetcd.Cluster
	// Scope is Patroni's name for the cluster, unique per cluster.
	Scope       string
	Synchronous bool

	http *http.Client
}

// Member is one Patroni process and the PostgreSQL it runs.
type Member struct {
	Name string
	Addr string // PostgreSQL's 127.0.0.1:port
	API  string // Patroni's REST API, 127.0.0.1:port

	c       *Cluster
	dir     string // the member's folder, the postgres user's
	dataDir string
	logFile string
	cred    *syscall.Credential // nil: run as ourselves

	mu         sync.Mutex
	cmd        *exec.Cmd
	exited     <-chan struct{}
	log        *tailLog
	postmaster int          // the PostgreSQL the last Kill ended, for Restart
	frozen     []frozenProc // what FreezeReplication stopped
	paused     []frozenProc // what Freeze stopped
}

// Start starts a cluster for tb, as Spawn does, in a new folder of the
// system's temporary one (tb.TempDir's folders are closed to the postgres
// user), and stops it and deletes the folder in tb's cleanup. It skips tb
// when a binary is missing, unless CI=true.
func Start(tb testing.TB, o Options) *Cluster {
	tb.Helper()
	dir, err := os.MkdirTemp("", "testpatroni-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) }) // registered first: runs after Stop
	if err := os.Chmod(dir, 0o711); err != nil {
		tb.Fatal(err)
	}
	c, err := Spawn(dir, o)
	testproc.Require(tb, err, ErrNoPatroni)
	tb.Cleanup(c.Stop)
	return c
}

// Spawn starts a cluster outside any test (a fault suite's, say): an etcd
// and the members, each in a folder of dir (created when missing; it stays
// the caller's to delete), and returns once WaitReady does, within 90 s.
// It returns ErrNoPatroni when a binary is missing. Stop it with Stop.
func Spawn(dir string, o Options) (*Cluster, error) {
	for _, bin := range []string{Bin, filepath.Join(BinDir, "postgres"), filepath.Join(BinDir, "pg_rewind"), testetcd.Bin} {
		if _, err := os.Stat(bin); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoPatroni, err)
		}
	}
	if o.Members < 1 {
		o.Members = 2
	}
	cred, err := runAs()
	if err != nil {
		return nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := reachable(dir, cred); err != nil {
		return nil, err
	}
	if o.LogDir != "" {
		if err := os.MkdirAll(o.LogDir, 0o755); err != nil {
			return nil, err
		}
	}
	etcd, err := testetcd.SpawnWith(filepath.Join(dir, "etcd"), 1, testetcd.Options{V2: true})
	if errors.Is(err, testetcd.ErrNoEtcd) {
		return nil, fmt.Errorf("%w: %w", ErrNoPatroni, err)
	}
	if err != nil {
		return nil, fmt.Errorf("testpatroni: etcd: %w", err)
	}
	c := &Cluster{
		Etcd:        etcd,
		Scope:       "testpatroni-" + strings.ToLower(rand.Text()[:10]),
		Synchronous: !o.Async,
		http:        &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{}},
	}
	fail := func(err error) (*Cluster, error) {
		c.Stop()
		return nil, err
	}
	for i := range o.Members {
		m := &Member{
			Name: fmt.Sprintf("m%d", i+1),
			Addr: "127.0.0.1:" + strconv.Itoa(testproc.FreePort()),
			API:  "127.0.0.1:" + strconv.Itoa(testproc.FreePort()),
			c:    c,
			cred: cred,
		}
		m.dir = filepath.Join(dir, m.Name)
		m.dataDir = filepath.Join(m.dir, "data")
		if o.LogDir != "" {
			m.logFile = filepath.Join(o.LogDir, m.Name+".log")
		}
		c.Members = append(c.Members, m)
		if err := m.writeConfig(); err != nil {
			return fail(err)
		}
	}
	// All at once: one wins the race to initialise the cluster, the others
	// wait for it and take a base backup from it.
	for _, m := range c.Members {
		if err := m.start(); err != nil {
			return fail(err)
		}
	}
	if err := c.WaitReady(context.Background()); err != nil {
		return fail(err)
	}
	return c, nil
}

// runAs is the postgres user under root, nil (ourselves) otherwise.
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("%w: no postgres user to run PostgreSQL as, instead of root: %w", ErrNoPatroni, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("testpatroni: user postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// reachable fails when cred's user cannot search a folder on the way to
// dir: Patroni would fail later, with a less clear message.
func reachable(dir string, cred *syscall.Credential) error {
	for d := dir; cred != nil; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		st, perm := fi.Sys().(*syscall.Stat_t), fi.Mode().Perm()
		search := perm & 0o001 // as the kernel decides: owner, else group, else others
		if st.Uid == cred.Uid {
			search = perm & 0o100
		} else if st.Gid == cred.Gid {
			search = perm & 0o010
		}
		if search == 0 {
			return fmt.Errorf("testpatroni: the postgres user cannot reach %s (%s is %v): use a folder it can search", dir, d, perm)
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	return nil
}

// config is a member's patroni.yml; strings are Go-quoted (%q), which YAML
// reads alike.
const config = `scope: %[1]q
name: %[2]q
restapi: {listen: %[3]q, connect_address: %[3]q}
etcd: {hosts: %[4]s}
watchdog: {mode: "off"}
bootstrap:
  dcs:
    # Patroni's rule: loop_wait + 2*retry_timeout <= ttl.
    ttl: 10
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: 1048576
    synchronous_mode: %[5]t
    synchronous_mode_strict: false
    postgresql:
      # A crashed primary may hold WAL its successor never received:
      # pg_rewind (which needs wal_log_hints) lets it follow again.
      use_pg_rewind: true
      use_slots: true
      parameters: {max_connections: 100, shared_buffers: 32MB, fsync: "on", wal_log_hints: "on",
        max_wal_senders: 10, max_replication_slots: 10}
  initdb: [{encoding: UTF8}, {locale: C}]
postgresql:
  listen: %[6]q
  connect_address: %[6]q
  data_dir: %[7]q
  bin_dir: %[8]q
  pgpass: %[9]q
  authentication: {superuser: {username: postgres}, replication: {username: replicator}}
  pg_hba: [local all all trust, local replication all trust,
    host all all 127.0.0.1/32 trust, host replication all 127.0.0.1/32 trust]
  # Not the system server's /var/run/postgresql, which only postgres may write.
  parameters: {unix_socket_directories: %[10]q}
  # One that cannot be rewound is cloned again: Restart always ends with a replica.
  remove_data_directory_on_rewind_failure: true
`

// writeConfig makes the member's folder and writes its patroni.yml.
func (m *Member) writeConfig() error {
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		return err
	}
	hosts, err := json.Marshal(m.c.Etcd.Endpoints()) // a JSON list is a YAML list
	if err != nil {
		return err
	}
	conf := fmt.Sprintf(config, m.c.Scope, m.Name, m.API, hosts, m.c.Synchronous,
		m.Addr, m.dataDir, BinDir, filepath.Join(m.dir, "pgpass"), m.dir)
	path := filepath.Join(m.dir, "patroni.yml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return err
	}
	if m.cred == nil {
		return nil
	}
	return errors.Join(os.Chown(m.dir, int(m.cred.Uid), int(m.cred.Gid)), os.Chown(path, int(m.cred.Uid), int(m.cred.Gid)))
}

// URL is a pgx URL of the member alone, whatever its role.
func (m *Member) URL(db string) string {
	return "postgres://postgres@" + m.Addr + "/" + db + "?sslmode=disable&connect_timeout=5"
}

// URL is a pgx URL naming every member, which connects to whichever
// accepts writes (target_session_attrs=read-write).
func (c *Cluster) URL(db string) string {
	hosts := make([]string, len(c.Members))
	for i, m := range c.Members {
		hosts[i] = m.Addr
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/" + db +
		"?sslmode=disable&connect_timeout=5&target_session_attrs=read-write"
}

// clusterState is Patroni's GET /cluster: the members as the DCS has them.
type clusterState struct {
	Members []struct {
		Name string `json:"name"`
		Role string `json:"role"` // leader, sync_standby, replica
	} `json:"members"`
}

// memberState is Patroni's GET /patroni: one member's PostgreSQL; on the
// primary, Replication is its pg_stat_replication.
type memberState struct {
	Replication []struct {
		Name      string `json:"application_name"` // the member's name
		State     string `json:"state"`            // streaming
		SyncState string `json:"sync_state"`       // sync, async, potential
	} `json:"replication"`
}

// get GETs path from m's REST API, decodes the answer into v unless v is
// nil, and returns the HTTP status.
func (c *Cluster) get(ctx context.Context, m *Member, path string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.API+path, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("patroni %s: %w", m.Name, err)
	}
	defer resp.Body.Close()
	if v != nil {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			return resp.StatusCode, fmt.Errorf("patroni %s %s: %w", m.Name, path, err)
		}
	}
	return resp.StatusCode, nil
}

// Primary is the member the DCS names as the leader, once its Patroni
// confirms (GET /primary answers 200) that its PostgreSQL runs as the
// primary. During a failover it returns an error.
func (c *Cluster) Primary(ctx context.Context) (*Member, error) {
	p, _, err := c.primary(ctx)
	return p, err
}

func (c *Cluster) primary(ctx context.Context) (*Member, clusterState, error) {
	st, err := c.state(ctx)
	if err != nil {
		return nil, st, err
	}
	for _, sm := range st.Members {
		for _, m := range c.Members {
			if sm.Role != "leader" || m.Name != sm.Name {
				continue
			}
			code, err := c.get(ctx, m, "/primary", nil)
			if err == nil && code != http.StatusOK {
				err = fmt.Errorf("leader %s does not run as the primary yet (GET /primary: %d)", m.Name, code)
			}
			if err != nil {
				return nil, st, err
			}
			return m, st, nil
		}
	}
	return nil, st, errors.New("no member holds the leader key")
}

// state is GET /cluster from the first running member whose Patroni answers.
func (c *Cluster) state(ctx context.Context) (clusterState, error) {
	errs := []error{errors.New("no Patroni answers")}
	for _, m := range c.Members {
		if m.Running() {
			var st clusterState
			_, err := c.get(ctx, m, "/cluster", &st)
			if err == nil {
				return st, nil
			}
			errs = append(errs, err)
		}
	}
	return clusterState{}, errors.Join(errs...)
}

// Role is m's role in the DCS ("leader", "sync_standby" or "replica"), as
// the first running member's Patroni that answers has it; "" when the DCS
// does not list m.
func (m *Member) Role(ctx context.Context) (string, error) {
	st, err := m.c.state(ctx)
	if err != nil {
		return "", err
	}
	for _, sm := range st.Members {
		if sm.Name == m.Name {
			return sm.Role, nil
		}
	}
	return "", nil
}

// WaitReady waits, within ctx and at most 90 s, until a primary runs,
// every other running member streams from it and, with synchronous
// replication and a replica running, one replica is the synchronous
// standby both in PostgreSQL (pg_stat_replication) and in the DCS (the
// only member Patroni would promote).
func (c *Cluster) WaitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyWithin)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := c.ready(ctx)
		if err == nil {
			return nil
		}
		for _, m := range c.Members {
			if started, exited := m.state(); started && exited {
				return fmt.Errorf("testpatroni: patroni %s exited: %w\n%s", m.Name, err, tail(m.Log(), 40))
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("testpatroni: cluster %s not ready: %w: %w\n%s", c.Scope, err, context.Cause(ctx), c.logTails())
		}
	}
}

func (c *Cluster) ready(ctx context.Context) error {
	p, st, err := c.primary(ctx)
	if err != nil {
		return err
	}
	var ms memberState
	if _, err := c.get(ctx, p, "/patroni", &ms); err != nil {
		return err
	}
	streams := map[string]string{} // member → sync_state
	for _, r := range ms.Replication {
		if r.State == "streaming" {
			streams[r.Name] = r.SyncState
		}
	}
	replicas, syncStandby := 0, ""
	for _, m := range c.Members {
		if m == p || !m.Running() {
			continue
		}
		replicas++
		s, ok := streams[m.Name]
		if !ok {
			return fmt.Errorf("%s does not stream from the primary %s", m.Name, p.Name)
		}
		if s == "sync" {
			syncStandby = m.Name
		}
	}
	if !c.Synchronous || replicas == 0 {
		return nil
	}
	if syncStandby == "" {
		return fmt.Errorf("no synchronous standby streams from the primary %s", p.Name)
	}
	for _, sm := range st.Members {
		if sm.Name == syncStandby && sm.Role == "sync_standby" {
			return nil
		}
	}
	return fmt.Errorf("%s streams synchronously, but the DCS does not name it the synchronous standby yet", syncStandby)
}

// logTails is the end of every member's log, for errors.
func (c *Cluster) logTails() string {
	var b strings.Builder
	for _, m := range c.Members {
		fmt.Fprintf(&b, "--- %s (%s, API %s):\n%s\n", m.Name, m.Addr, m.API, tail(m.Log(), 25))
	}
	return b.String()
}

// Stop kills every member, then the etcd.
func (c *Cluster) Stop() {
	for _, m := range c.Members {
		_ = m.Kill()
	}
	if c.Etcd != nil {
		c.Etcd.Stop()
	}
	c.http.CloseIdleConnections()
}
