package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/lab/report"
	"github.com/flashsale/stock/lab/testzk"
)

// environment describes the machine, the versions and the database settings
// that decide hot-row speed. Whatever cannot be read is left out, not
// guessed.
func environment(ctx context.Context, p plan, k6Bin string) report.Environment {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	e := report.Environment{Cores: runtime.NumCPU(), Go: runtime.Version()}
	e.Host, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				e.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				if kb, err := strconv.ParseFloat(f[1], 64); err == nil {
					e.Memory = fmt.Sprintf("%.0f GiB", kb/1024/1024)
				}
			}
		}
	}
	e.OS = osRelease()
	e.LoadAtStart = loadAverage()
	e.K6 = firstLine(commandOutput(ctx, k6Bin, "version"))
	e.GitCommit = gitCommit(ctx)
	if out := commandOutput(ctx, "redis-server", "--version"); out != "" {
		e.Redis = firstLine(out)
	}
	for _, b := range p.Backends {
		switch b.Name {
		case "postgres":
			e.Postgres, e.DBSettings = postgresInfo(ctx, b.URL, e.DBSettings)
		case "mysql":
			e.MySQL, e.DBSettings = mysqlInfo(ctx, b.URL, e.DBSettings)
		}
	}
	return e
}

// etcdVersion asks the first endpoint's GET /version ({"etcdserver":
// "3.4.23", …}); "" when it does not answer.
func etcdVersion(ctx context.Context, endpoints []string) string {
	if len(endpoints) == 0 {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoints[0]+"/version", nil)
	if err != nil {
		return ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var v struct {
		Server  string `json:"etcdserver"`
		Cluster string `json:"etcdcluster"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&v) != nil || v.Server == "" {
		return ""
	}
	return fmt.Sprintf("etcd %s (cluster version %s) at %s", v.Server, v.Cluster, strings.Join(endpoints, ","))
}

// zkVersion asks the first server's srvr ("Zookeeper version: 3.8.0-…,
// built on …"); "" when it does not answer or does not allow srvr.
func zkVersion(servers []string) string {
	if len(servers) == 0 {
		return ""
	}
	out, err := testzk.FourLetter(servers[0], "srvr")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "Zookeeper version: "); ok {
			// "3.8.0-<commit>, built on …"; Debian's build leaves
			// the commit as ${mvngit.commit.id}.
			v, _, _ = strings.Cut(v, ",")
			v, _, _ = strings.Cut(v, "-")
			return fmt.Sprintf("ZooKeeper %s at %s", strings.TrimSpace(v), strings.Join(servers, ","))
		}
	}
	return ""
}

// loadAverage is /proc/loadavg's 1, 5 and 15 minute figures.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func osRelease() string {
	name := runtime.GOOS
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				name = strings.Trim(v, `"`)
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		name += ", kernel " + strings.TrimSpace(string(b))
	}
	return name
}

func commandOutput(ctx context.Context, name string, args ...string) string {
	out, err := exec.CommandContext(ctx, name, args...).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// gitCommit names the code that was measured; uncommitted changes are said.
func gitCommit(ctx context.Context) string {
	commit := commandOutput(ctx, "git", "rev-parse", "--short=12", "HEAD")
	if commit == "" {
		return "unknown (not a git checkout)"
	}
	if commandOutput(ctx, "git", "status", "--porcelain", "--untracked-files=no") != "" {
		commit += " with uncommitted changes"
	}
	return commit
}

func postgresInfo(ctx context.Context, url string, settings []report.Setting) (string, []report.Setting) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "unreachable: " + err.Error(), settings
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var version string
	_ = conn.QueryRow(ctx, `SELECT version()`).Scan(&version)
	if short, _, ok := strings.Cut(version, " on "); ok {
		version = short
	}
	for _, s := range []struct{ name, note string }{
		{"synchronous_commit", "on: every commit waits for its WAL flush, which bounds a hot row"},
		{"fsync", ""},
		{"max_connections", "the instances' pools must fit"},
		{"shared_buffers", ""},
	} {
		var v string
		if err := conn.QueryRow(ctx, "SHOW "+s.name).Scan(&v); err == nil {
			settings = append(settings, report.Setting{Name: "PostgreSQL " + s.name, Value: v, Note: s.note})
		}
	}
	return version, settings
}

func mysqlInfo(ctx context.Context, url string, settings []report.Setting) (string, []report.Setting) {
	cfg, err := dburl.MySQL(url)
	if err != nil {
		return "bad URL: " + err.Error(), settings
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return "bad URL: " + err.Error(), settings
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	var version string
	if err := db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version); err != nil {
		return "unreachable: " + err.Error(), settings
	}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		version = "MariaDB " + version
	} else {
		version = "MySQL " + version
	}
	for _, s := range []struct{ name, note string }{
		{"innodb_flush_log_at_trx_commit", "1: every commit flushes the redo log"},
		{"max_connections", ""},
		{"transaction_isolation", ""},
		{"innodb_buffer_pool_size", ""},
	} {
		var v string
		if err := db.QueryRowContext(ctx, "SELECT @@"+s.name).Scan(&v); err == nil {
			settings = append(settings, report.Setting{Name: "MariaDB/MySQL " + s.name, Value: v, Note: s.note})
		}
	}
	return version, settings
}
