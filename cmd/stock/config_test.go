package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/strategies"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigDefaults(t *testing.T) {
	c, err := loadConfig(env(map[string]string{"DATABASE_URL": "postgres://u:pw@h/db"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Strategy != "conditional" || c.HTTPAddr != ":8080" || c.DBMaxConns != 16 || c.OrderTimeout != 3*time.Second || !c.Migrate || c.AdminToken != "" {
		t.Errorf("defaults: %+v", c)
	}
	logged := fmtAttrs(c.logAttrs())
	if strings.Contains(logged, "pw") || !strings.Contains(logged, "xxxxx") {
		t.Errorf("the logged configuration must mask the password: %s", logged)
	}
}

func TestConfigMasksToken(t *testing.T) {
	c, err := loadConfig(env(map[string]string{"DATABASE_URL": "mysql://root@h:3306/db", "ADMIN_TOKEN": "s3cr3t-s3cr3t-s3cr3t"}))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(fmtAttrs(c.logAttrs()), "s3cr3t") {
		t.Error("the logged configuration shows the admin token")
	}
}

func TestConfigErrorsListEveryProblem(t *testing.T) {
	_, err := loadConfig(env(map[string]string{
		"STRATEGY": "optimistic", "DATABASE_URL": "redis://x", "DB_MAX_CONNS": "0",
		"ORDER_TIMEOUT": "-1s", "MIGRATE": "maybe", "LOG_LEVEL": "loud", "HTTP_MAX_CONNS": "none", "HTTP_IDLE_TIMEOUT": "0",
	}))
	if err == nil {
		t.Fatal("bad configuration accepted")
	}
	for _, want := range []string{"valid: naive, for-update, version-cas, conditional", "redis", "DB_MAX_CONNS", "ORDER_TIMEOUT", "MIGRATE", "LOG_LEVEL", "HTTP_MAX_CONNS", "HTTP_IDLE_TIMEOUT"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestConfigRefusesShortAdminToken: a guessable admin token (compose's old
// default "change-me" among them) stops the service; unset still means
// "admin routes disabled".
func TestConfigRefusesShortAdminToken(t *testing.T) {
	for _, token := range []string{"change-me", "s3cr3t", "zq", "fifteen-chars!!", "ééééééééééééééé"} {
		_, err := loadConfig(env(map[string]string{"DATABASE_URL": "postgres://h/db", "ADMIN_TOKEN": token}))
		if err == nil || !strings.Contains(err.Error(), "ADMIN_TOKEN must be at least 16 characters") {
			t.Errorf("ADMIN_TOKEN=%q: %v, want a refusal", token, err)
			continue
		}
		if strings.Contains(err.Error(), token) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ADMIN_TOKEN=%q: the error shows the token or spans lines: %v", token, err)
		}
	}
	for _, token := range []string{"", "sixteen-chars!!!", "éééééééééééééééé"} {
		if _, err := loadConfig(env(map[string]string{"DATABASE_URL": "postgres://h/db", "ADMIN_TOKEN": token})); err != nil {
			t.Errorf("ADMIN_TOKEN=%q refused: %v", token, err)
		}
	}
}

func fmtAttrs(attrs []any) string { return fmt.Sprint(attrs...) }

// TestRowMaxInFlight: the strategies that queue on the row are bounded per
// SKU by ROW_MAX_IN_FLIGHT (default 4); 0 leaves them unbounded.
func TestRowMaxInFlight(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  int
	}{{"", 4}, {"1", 1}, {"0", 0}} {
		c, err := loadConfig(env(map[string]string{"DATABASE_URL": "postgres://u@h/db", "ROW_MAX_IN_FLIGHT": tc.value}))
		if err != nil {
			t.Fatal(err)
		}
		if c.RowMaxInFlight != tc.want {
			t.Errorf("ROW_MAX_IN_FLIGHT=%q: %d, want %d", tc.value, c.RowMaxInFlight, tc.want)
		}
		for _, name := range []string{"conditional", "for-update", "naive"} {
			c.Strategy = name
			s, stop, err := strategies.Build(context.Background(), c.strategyConfig(), strategies.Deps{})
			if err != nil {
				t.Fatal(err)
			}
			stop()
			if gated := gatesAtOne(t, s); gated != (tc.want == 1) || s.Name != name {
				t.Errorf("ROW_MAX_IN_FLIGHT=%q, %s: built %q, one order at a time per SKU: %v", tc.value, name, s.Name, gated)
			}
		}
	}
	if _, err := loadConfig(env(map[string]string{"DATABASE_URL": "postgres://u@h/db", "ROW_MAX_IN_FLIGHT": "-1"})); err == nil || !strings.Contains(err.Error(), "ROW_MAX_IN_FLIGHT") {
		t.Errorf("ROW_MAX_IN_FLIGHT=-1: %v, want it refused", err)
	}
}

// TestBatchConfig: STRATEGY=batched takes BATCH_MAX (default 256) and
// BATCH_WAIT (default 0); the other strategies refuse them.
func TestBatchConfig(t *testing.T) {
	c, err := loadConfig(env(map[string]string{"DATABASE_URL": "postgres://u@h/db", "STRATEGY": "batched"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.BatchMax != 256 || c.BatchWait != 0 {
		t.Errorf("defaults: BATCH_MAX %d, BATCH_WAIT %v", c.BatchMax, c.BatchWait)
	}
	c, err = loadConfig(env(map[string]string{"DATABASE_URL": "postgres://u@h/db", "STRATEGY": "batched", "BATCH_MAX": "32", "BATCH_WAIT": "2ms"}))
	if err != nil || c.BatchMax != 32 || c.BatchWait != 2*time.Millisecond {
		t.Errorf("BATCH_MAX=32 BATCH_WAIT=2ms: %+v, %v", c, err)
	}
	for _, bad := range []map[string]string{
		{"STRATEGY": "batched", "BATCH_MAX": "0"},
		{"STRATEGY": "batched", "BATCH_WAIT": "-1ms"},
		{"BATCH_MAX": "32"},
		{"STRATEGY": "for-update", "BATCH_WAIT": "1ms"},
	} {
		bad["DATABASE_URL"] = "postgres://u@h/db"
		if _, err := loadConfig(env(bad)); err == nil || !strings.Contains(err.Error(), "BATCH_") {
			t.Errorf("%v: %v, want a refusal naming the variable", bad, err)
		}
	}
}

// TestBatchWaitAtLeastOrderTimeoutIsRefused: with BATCH_WAIT >=
// ORDER_TIMEOUT a leader whose batch does not fill to BATCH_MAX would wait
// its whole deadline out and answer busy, and so would each next leader:
// every order of a quiet SKU refused busy with stock on the shelf. Such a
// configuration is refused at startup (and internal/inventory caps the
// wait too: see TestBatchedWaitLeavesTimeToRun).
func TestBatchWaitAtLeastOrderTimeoutIsRefused(t *testing.T) {
	_, err := loadConfig(env(map[string]string{"DATABASE_URL": "postgres://u@h/db", "STRATEGY": "batched", "BATCH_WAIT": "5s", "ORDER_TIMEOUT": "3s"}))
	if err == nil || !strings.Contains(err.Error(), "BATCH_WAIT") {
		t.Errorf("BATCH_WAIT=5s ORDER_TIMEOUT=3s: %v, want a refusal naming BATCH_WAIT", err)
	}
}

// TestReservedConfiguration: redis-reserve and redis-watch default to a
// durable standalone Redis; REDIS_MODE=cluster and RESERVE_* apply only to
// them, REDIS_MODE=sentinel to them and the one-Redis locks, and bad
// values are named.
func TestReservedConfiguration(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "postgres://h/db"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, strategy := range strategies.ReservedNames {
		c, err := loadConfig(env(with("STRATEGY", strategy)))
		if err != nil || !c.ReserveDurable || c.RedisCluster || c.ReserveClaimIdle != 5*time.Second {
			t.Errorf("%s defaults: %+v %v", strategy, c, err)
		}
		c, err = loadConfig(env(with("STRATEGY", strategy, "REDIS_MODE", "cluster", "RESERVE_DURABILITY", "none", "RESERVE_CLAIM_IDLE", "2s")))
		if err != nil || c.ReserveDurable || !c.RedisCluster || c.ReserveClaimIdle != 2*time.Second {
			t.Errorf("%s set: %+v %v", strategy, c, err)
		}
	}
	// Behind Sentinel an order waits for one replica by default; on one
	// Redis for none.
	if c, err := loadConfig(env(with("STRATEGY", "redis-reserve"))); err != nil || c.ReserveWaitReplicas != 0 || c.RedisSentinelMaster != "" {
		t.Errorf("redis-reserve on one Redis: %d replicas waited for, sentinel master %q, %v; want 0 and none", c.ReserveWaitReplicas, c.RedisSentinelMaster, err)
	}
	for _, strategy := range []string{"redis-reserve", "redis-watch", "redis-lock", "legacy-getset"} {
		c, err := loadConfig(env(with("STRATEGY", strategy, "REDIS_MODE", "sentinel")))
		if err != nil || c.RedisSentinelMaster != "mymaster" || c.ReserveWaitReplicas != 1 || c.ReserveWaitTimeout != 500*time.Millisecond {
			t.Errorf("%s behind Sentinel: master %q, %d replicas waited for %s, %v; want mymaster, 1, 500ms", strategy, c.RedisSentinelMaster, c.ReserveWaitReplicas, c.ReserveWaitTimeout, err)
		}
	}
	if c, err := loadConfig(env(with("STRATEGY", "redis-watch", "REDIS_MODE", "sentinel", "REDIS_SENTINEL_MASTER", "sale", "RESERVE_WAIT_REPLICAS", "2", "RESERVE_WAIT_TIMEOUT", "50ms"))); err != nil ||
		c.RedisSentinelMaster != "sale" || c.ReserveWaitReplicas != 2 || c.ReserveWaitTimeout != 50*time.Millisecond {
		t.Errorf("Sentinel set: master %q, %d replicas waited for %s, %v", c.RedisSentinelMaster, c.ReserveWaitReplicas, c.ReserveWaitTimeout, err)
	}
	if c, err := loadConfig(env(with("STRATEGY", "redis-reserve"))); err != nil || c.ReservePipelines != 4 {
		t.Errorf("redis-reserve's pipelines by default: %d %v, want 4", c.ReservePipelines, err)
	}
	if c, err := loadConfig(env(with("STRATEGY", "redis-reserve", "RESERVE_PIPELINES", "0"))); err != nil || c.ReservePipelines != 0 {
		t.Errorf("RESERVE_PIPELINES=0: %d %v", c.ReservePipelines, err)
	}
	for _, bad := range []struct {
		env  map[string]string
		want string
	}{
		{with("STRATEGY", "redis-reserve", "REDIS_MODE", "replicas"), `REDIS_MODE="replicas" is not standalone, cluster or sentinel`},
		{with("STRATEGY", "redlock", "REDIS_MODE", "sentinel"), "REDIS_MODE=sentinel applies only to STRATEGY="},
		{with("STRATEGY", "conditional", "REDIS_MODE", "sentinel"), "REDIS_MODE=sentinel applies only to STRATEGY="},
		{with("STRATEGY", "redis-reserve", "REDIS_SENTINEL_MASTER", "m"), "REDIS_SENTINEL_MASTER applies only to REDIS_MODE=sentinel"},
		{with("STRATEGY", "redis-reserve", "REDIS_MODE", "cluster", "RESERVE_WAIT_REPLICAS", "1"), "RESERVE_WAIT_REPLICAS applies only to one Redis"},
		{with("STRATEGY", "redis-lock", "RESERVE_WAIT_REPLICAS", "1"), "RESERVE_WAIT_REPLICAS applies only to STRATEGY=redis-reserve or redis-watch"},
		{with("STRATEGY", "redis-reserve", "RESERVE_WAIT_TIMEOUT", "3s"), "RESERVE_WAIT_TIMEOUT=3s must be at least 1ms and shorter than ORDER_TIMEOUT=3s"},
		{with("STRATEGY", "redis-lock", "REDIS_MODE", "cluster"), "REDIS_MODE=cluster applies only to STRATEGY=redis-reserve or redis-watch"},
		{with("STRATEGY", "redis-reserve", "RESERVE_DURABILITY", "fsync"), `RESERVE_DURABILITY="fsync" is not aof or none`},
		{with("STRATEGY", "conditional", "RESERVE_CLAIM_IDLE", "1s"), "applies only to STRATEGY=redis-reserve or redis-watch"},
		{with("STRATEGY", "conditional", "RESERVE_RECONCILE_EVERY", "1m"), "applies only to STRATEGY=redis-reserve or redis-watch"},
		{with("STRATEGY", "redis-watch", "RESERVE_PIPELINES", "2"), "RESERVE_PIPELINES applies only to STRATEGY=redis-reserve"},
		{with("STRATEGY", "redis-reserve", "RESERVE_PIPELINES", "65"), "RESERVE_PIPELINES"},
	} {
		if _, err := loadConfig(env(bad.env)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: %v, want %q", bad.env, err, bad.want)
		}
	}
}

// TestJobsAndAdmissionConfig: AUDIT_EVERY defaults to 30s and 0 turns it
// off; ADMISSION_LIMIT is off by default and applies only to the SQL
// strategies, which queue on the row in the database.
func TestJobsAndAdmissionConfig(t *testing.T) {
	c, err := loadConfig(env(map[string]string{"DATABASE_URL": "postgres://u@h/db"}))
	if err != nil || c.AuditEvery != 30*time.Second || c.AdmissionLimit != 0 {
		t.Fatalf("defaults: AUDIT_EVERY %v, ADMISSION_LIMIT %d, %v", c.AuditEvery, c.AdmissionLimit, err)
	}
	c, err = loadConfig(env(map[string]string{"DATABASE_URL": "postgres://u@h/db", "AUDIT_EVERY": "0", "ADMISSION_LIMIT": "4", "STRATEGY": "for-update"}))
	if err != nil || c.AuditEvery != 0 || c.AdmissionLimit != 4 {
		t.Fatalf("AUDIT_EVERY=0 ADMISSION_LIMIT=4: %v, %d, %v", c.AuditEvery, c.AdmissionLimit, err)
	}
	for _, bad := range []map[string]string{
		{"STRATEGY": "batched", "ADMISSION_LIMIT": "4"},
		{"STRATEGY": "db-lock", "ADMISSION_LIMIT": "4"},
		{"ADMISSION_LIMIT": "-1"},
		{"AUDIT_EVERY": "soon"},
		{"JOB_LOCK": "zookeeper"},
	} {
		bad["DATABASE_URL"] = "postgres://u@h/db"
		if _, err := loadConfig(env(bad)); err == nil {
			t.Errorf("%v was accepted", bad)
		}
	}
}

// TestHTTPConnectionsConfig: HTTP_MAX_CONNS defaults to what the process's
// descriptor limit leaves (at most 10,000) and HTTP_IDLE_TIMEOUT to 5s, not
// the minute that let one client's idle connections pile up; bad values,
// and a cap the descriptor limit cannot hold, are refused naming the
// variable.
func TestHTTPConnectionsConfig(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "postgres://u@h/db"}
	with := func(kv ...string) map[string]string {
		m := maps.Clone(base)
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	c, err := loadConfig(env(base))
	if err != nil {
		t.Fatal(err)
	}
	nofile := openFileLimit()
	if want := defaultHTTPMaxConns(nofile, 16); c.HTTPMaxConns != want || c.HTTPIdleTimeout != 5*time.Second {
		t.Errorf("defaults with %d descriptors: HTTP_MAX_CONNS %d (want %d), HTTP_IDLE_TIMEOUT %v (want 5s)", nofile, c.HTTPMaxConns, want, c.HTTPIdleTimeout)
	}
	if !strings.Contains(fmtAttrs(c.logAttrs()), "http_max_conns") {
		t.Error("the logged configuration lacks http_max_conns")
	}
	c, err = loadConfig(env(with("HTTP_MAX_CONNS", "100", "HTTP_IDLE_TIMEOUT", "2s")))
	if err != nil || c.HTTPMaxConns != 100 || c.HTTPIdleTimeout != 2*time.Second {
		t.Errorf("HTTP_MAX_CONNS=100 HTTP_IDLE_TIMEOUT=2s: %d %v %v", c.HTTPMaxConns, c.HTTPIdleTimeout, err)
	}
	for _, bad := range []struct {
		env  map[string]string
		want string
	}{
		{with("HTTP_MAX_CONNS", "0"), `HTTP_MAX_CONNS="0" is not a positive integer`},
		{with("HTTP_MAX_CONNS", "-5"), `HTTP_MAX_CONNS="-5" is not a positive integer`},
		{with("HTTP_MAX_CONNS", "lots"), `HTTP_MAX_CONNS="lots" is not a positive integer`},
		{with("HTTP_MAX_CONNS", strconv.Itoa(nofile)), fmt.Sprintf("HTTP_MAX_CONNS=%d is more than the process's %d file descriptors (RLIMIT_NOFILE)", nofile, nofile)},
		{with("HTTP_IDLE_TIMEOUT", "0"), `HTTP_IDLE_TIMEOUT="0" is not a positive duration`},
		{with("HTTP_IDLE_TIMEOUT", "-1s"), `HTTP_IDLE_TIMEOUT="-1s" is not a positive duration`},
		{with("HTTP_IDLE_TIMEOUT", "60"), `HTTP_IDLE_TIMEOUT="60" is not a positive duration`},
	} {
		if _, err := loadConfig(env(bad.env)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: %v, want %q", bad.env, err, bad.want)
		}
	}
}

// TestDefaultHTTPMaxConns: the default cap leaves the database pool, the
// operator headroom and other files their descriptors, keeps half of a
// small limit for them, and never passes 10,000.
func TestDefaultHTTPMaxConns(t *testing.T) {
	for _, c := range []struct{ nofile, dbMaxConns, want int }{
		{1 << 30, 16, 10000}, // RLIM_INFINITY, clamped
		{1 << 20, 16, 10000}, // a container's usual limit
		{20000, 16, 10000},
		{4096, 16, 3536},   // 4096 - (16 + 32 + 512)
		{4096, 1000, 2552}, // 4096 - (1000 + 32 + 512)
		{1024, 16, 512},    // half of a small limit
		{64, 16, 32},
		{1, 16, 1},
	} {
		if got := defaultHTTPMaxConns(c.nofile, c.dbMaxConns); got != c.want {
			t.Errorf("%d descriptors, DB_MAX_CONNS=%d: HTTP_MAX_CONNS %d, want %d", c.nofile, c.dbMaxConns, got, c.want)
		}
	}
}

// TestHoldConfig: HOLD_TTL defaults to 0 (orders final at once), the
// per-user limit to none, and the
// sweep to every second; a hold shorter than a second is refused with a
// line that names the variable; every strategy takes HOLD_TTL and
// PER_USER_LIMIT.
func TestHoldConfig(t *testing.T) {
	c, err := loadConfig(env(map[string]string{"DATABASE_URL": "postgres://u@h/db"}))
	if err != nil || c.HoldTTL != 0 || c.HoldSweepEvery != time.Second || c.PerUserLimit != 0 {
		t.Fatalf("defaults: HOLD_TTL %v, HOLD_SWEEP_EVERY %v, %v", c.HoldTTL, c.HoldSweepEvery, err)
	}
	c, err = loadConfig(env(map[string]string{"DATABASE_URL": "postgres://u@h/db", "HOLD_TTL": "15m", "HOLD_SWEEP_EVERY": "0", "STRATEGY": "redis-lock"}))
	if err != nil || c.HoldTTL != 15*time.Minute || c.HoldSweepEvery != 0 {
		t.Fatalf("HOLD_TTL=15m HOLD_SWEEP_EVERY=0: %v, %v, %v", c.HoldTTL, c.HoldSweepEvery, err)
	}
	// The reservation strategies count the buyers' units in Redis, and
	// relay returns there.
	c, err = loadConfig(env(map[string]string{"DATABASE_URL": "postgres://u@h/db", "PER_USER_LIMIT": "2", "HOLD_TTL": "15m", "STRATEGY": "redis-reserve"}))
	if err != nil || c.PerUserLimit != 2 || c.HoldTTL != 15*time.Minute {
		t.Fatalf("PER_USER_LIMIT=2 HOLD_TTL=15m with redis-reserve: %v, %v, %v", c.PerUserLimit, c.HoldTTL, err)
	}
	if c.SoldOutTTL != sales.DefaultSoldOutTTL {
		t.Errorf("SOLD_OUT_TTL defaults to %v, want %v", c.SoldOutTTL, sales.DefaultSoldOutTTL)
	}
	if c, err := loadConfig(env(map[string]string{"DATABASE_URL": "postgres://u@h/db", "SOLD_OUT_TTL": "0"})); err != nil || c.SoldOutTTL != 0 {
		t.Errorf("SOLD_OUT_TTL=0 (the mark off): %v, %v", c.SoldOutTTL, err)
	}
	if _, err := loadConfig(env(map[string]string{"DATABASE_URL": "postgres://u@h/db", "SOLD_OUT_TTL": "soon"})); err == nil || !strings.Contains(err.Error(), "SOLD_OUT_TTL") {
		t.Errorf("SOLD_OUT_TTL=soon: %v, want a refusal naming the variable", err)
	}
	for _, bad := range []map[string]string{
		{"HOLD_TTL": "500ms"},
		{"HOLD_TTL": "-1s"},
		{"HOLD_TTL": "later"},
		{"HOLD_SWEEP_EVERY": "often"},
		{"PER_USER_LIMIT": "-1"},
	} {
		bad["DATABASE_URL"] = "postgres://u@h/db"
		_, err := loadConfig(env(bad))
		if err == nil || !strings.Contains(err.Error(), "HOLD_") && !strings.Contains(err.Error(), "PER_USER_LIMIT") {
			t.Errorf("%v: %v, want a refusal naming the variable", bad, err)
		}
	}
}

// gatesAtOne reports whether s lets only one order per SKU into its
// transaction at once: a second order, while the first holds its
// transaction, waits for its place until its deadline and never reaches
// its own.
func gatesAtOne(t *testing.T, s inventory.Strategy) bool {
	t.Helper()
	entered, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- s.Deduct(context.Background(), "sku", 1, func(context.Context, func(context.Context, inventory.StockTx) error) error {
			close(entered)
			<-release
			return nil
		})
	}()
	<-entered
	defer func() {
		close(release)
		if err := <-first; err != nil {
			t.Errorf("the first order: %v", err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	reached := false
	err := s.Deduct(ctx, "sku", 1, func(context.Context, func(context.Context, inventory.StockTx) error) error {
		reached = true
		return nil
	})
	if !reached && !errors.Is(err, inventory.ErrBusy) {
		t.Errorf("the second order, kept out: %v, want busy", err)
	}
	return !reached
}
