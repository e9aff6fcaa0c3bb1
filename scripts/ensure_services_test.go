// Package scripts_test checks scripts/ensure-services.sh without touching
// the machine's servers: every command that could reach or change one
// (psql, pg_isready, pg_ctlcluster, mariadb, mariadb-admin, apt-get, …) is a
// stub on PATH that logs its call, and the script's PostgreSQL configuration
// directory and install markers are temporary directories.
package scripts_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// stubs are the commands the script may run against a server. Each logs
// "name args" (and MYSQL_PWD for mariadb) to $CALLS, then behaves as the
// scenario's STUB_* variables say.
var stubs = map[string]string{
	"psql": `if [ "${STUB_PSQL:-}" = ok ] || { [ "${STUB_PSQL:-}" = trust ] && grep -q trust "$STOCK_DEV_PG_ETC"/15/main/pg_hba.conf; }; then echo 1; exit 0; fi
echo 'psql: error: FATAL:  password authentication failed for user "postgres"' >&2; exit 2`,
	"pg_isready":    `exit 0`,
	"pg_ctlcluster": `exit 0`,
	"mariadb": `echo "MYSQL_PWD=${MYSQL_PWD:-}" >>"$CALLS"
if [ "${STUB_MARIADB:-}" = ok ] || { [ "${STUB_MARIADB:-}" = reset ] && grep -q "ALTER USER" "$CALLS"; }; then exit 0; fi
echo "ERROR 1045 (28000): Access denied for user 'root'@'localhost' (using password: NO)" >&2; exit 1`,
	"mariadb-admin":     `exit 0`,
	"mariadbd":          `exit 0`,
	"start-stop-daemon": `exit 0`,
	"redis-cli":         `echo PONG`,
	"redis-server":      `exit 0`,
	"apt-get":           `exit 1`,
}

type run struct {
	err    error
	stderr string
	calls  string
	pgHBA  string
}

// ensureServices runs the script with the stubs, a PostgreSQL 15 cluster
// directory whose pg_hba.conf asks for passwords, and the markers of
// installed (servers the script is to treat as its own).
func ensureServices(t *testing.T, installed []string, env ...string) run {
	t.Helper()
	dir := t.TempDir()
	bin, markers, etc := filepath.Join(dir, "bin"), filepath.Join(dir, "markers"), filepath.Join(dir, "etc")
	hba := filepath.Join(etc, "15", "main", "pg_hba.conf")
	calls := filepath.Join(dir, "calls")
	for _, d := range []string{bin, markers, filepath.Dir(hba)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range stubs {
		script := "#!/bin/bash\necho \"" + name + " $*\" >>\"$CALLS\"\n" + body + "\n"
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range installed {
		if err := os.WriteFile(filepath.Join(markers, "installed-"+name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const asksForPasswords = "host all all 127.0.0.1/32 scram-sha-256\n"
	if err := os.WriteFile(hba, []byte(asksForPasswords), 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command("bash", "ensure-services.sh")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.Env = []string{
		"PATH=" + bin + ":" + os.Getenv("PATH"), "HOME=" + dir, "CALLS=" + calls,
		"STOCK_DEV_MARKERS=" + markers, "STOCK_DEV_PG_ETC=" + etc,
	}
	cmd.Env = append(cmd.Env, env...)
	err := cmd.Run()
	logged, _ := os.ReadFile(calls)
	after, _ := os.ReadFile(hba)
	return run{err: err, stderr: strings.TrimSpace(stderr.String()), calls: string(logged), pgHBA: string(after)}
}

// oneLineNaming checks that the script stopped with one line that names
// the variable to set.
func oneLineNaming(t *testing.T, r run, variable string) {
	t.Helper()
	if r.err == nil {
		t.Fatalf("the script succeeded; calls:\n%s", r.calls)
	}
	if strings.Contains(r.stderr, "\n") || !strings.Contains(r.stderr, variable) {
		t.Errorf("stderr %q, want one line naming %s", r.stderr, variable)
	}
}

// TestForeignPostgresIsNotReconfigured: a PostgreSQL that runs, was not
// installed by the script and refuses postgres without a password keeps its
// pg_hba.conf and is not reloaded; the script names TEST_POSTGRES_URL.
func TestForeignPostgresIsNotReconfigured(t *testing.T) {
	r := ensureServices(t, nil, "STUB_MARIADB=ok")
	oneLineNaming(t, r, "TEST_POSTGRES_URL")
	if strings.Contains(r.pgHBA, "trust") {
		t.Errorf("pg_hba.conf was changed:\n%s", r.pgHBA)
	}
	if strings.Contains(r.calls, "pg_ctlcluster") {
		t.Errorf("the cluster was started or reloaded:\n%s", r.calls)
	}
}

// TestForeignMariaDBIsNotReconfigured: a MariaDB that was not installed by
// the script and refuses root without a password keeps its root password;
// the script names TEST_MYSQL_URL.
func TestForeignMariaDBIsNotReconfigured(t *testing.T) {
	r := ensureServices(t, nil, "STUB_PSQL=ok")
	oneLineNaming(t, r, "TEST_MYSQL_URL")
	if strings.Contains(r.calls, "ALTER USER") {
		t.Errorf("root's password was reset:\n%s", r.calls)
	}
}

// TestOwnServersAreConfigured: on servers the script installed, it adds
// trust to pg_hba.conf (and reloads the running cluster) and lets root in
// with an empty password, as before.
func TestOwnServersAreConfigured(t *testing.T) {
	r := ensureServices(t, []string{"postgres", "mariadb"}, "STUB_PSQL=trust", "STUB_MARIADB=reset")
	if r.err != nil {
		t.Fatalf("%v: %s\n%s", r.err, r.stderr, r.calls)
	}
	if !strings.Contains(r.calls, "ALTER USER root@localhost") {
		t.Errorf("root was not let in over TCP on the script's own MariaDB:\n%s", r.calls)
	}
	if !strings.Contains(r.pgHBA, "127.0.0.1/32 trust") {
		t.Errorf("pg_hba.conf of the script's own cluster has no trust line:\n%s", r.pgHBA)
	}
	if !strings.Contains(r.calls, "pg_ctlcluster --skip-systemctl-redirect 15 main reload") {
		t.Errorf("the running cluster was not reloaded:\n%s", r.calls)
	}
}

// TestServersOfTheTestVariables: TEST_POSTGRES_URL and TEST_MYSQL_URL name
// the servers the script checks and creates the stock database on; one that
// does not answer stops the script with one line naming its variable.
func TestServersOfTheTestVariables(t *testing.T) {
	r := ensureServices(t, nil, "STUB_PSQL=ok", "STUB_MARIADB=ok",
		"TEST_POSTGRES_URL=postgres://app:pw@db.internal:6432/postgres",
		"TEST_MYSQL_URL=mysql://app:p%40ss@my.internal:3307/mysql")
	if r.err != nil {
		t.Fatalf("%v: %s\n%s", r.err, r.stderr, r.calls)
	}
	for _, want := range []string{
		"psql postgres://app:pw@db.internal:6432/postgres -Atc select 1 from pg_database where datname = 'stock'",
		"mariadb --protocol=tcp -h my.internal -P 3307 -u app --connect-timeout=3 -e CREATE DATABASE IF NOT EXISTS stock",
		"MYSQL_PWD=p@ss",
	} {
		if !strings.Contains(r.calls, want) {
			t.Errorf("no call %q in:\n%s", want, r.calls)
		}
	}

	r = ensureServices(t, nil, "STUB_MARIADB=ok", "TEST_POSTGRES_URL=postgres://app:pw@db.internal:6432/postgres")
	oneLineNaming(t, r, "TEST_POSTGRES_URL")
	if strings.Contains(r.calls, "pg_ctlcluster") || strings.Contains(r.pgHBA, "trust") {
		t.Errorf("the local cluster was touched for a server named by TEST_POSTGRES_URL:\n%s", r.calls)
	}
}
