package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testredis"
)

// TestRedisEvictionPolicy: the service refuses, with one line, to lock on a
// Redis that may evict keys (an evicted fencing counter starts the tokens
// again, and fencing with them), and on one whose policy it cannot read
// (CONFIG renamed away) unless REDIS_SKIP_POLICY_CHECK=1 says the operator
// checked it. The servers are private ones started here.
func TestRedisEvictionPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real service processes")
	}
	lru := testredis.Start(t, "--maxmemory-policy", "allkeys-lru").Addr
	good := startRedisServers(t, 2)
	noConfig := testredis.Start(t, "--rename-command", "CONFIG", "").Addr
	db := "DATABASE_URL=" + testdb.URL(t, "postgres")

	for _, c := range []struct {
		env  []string
		want []string
	}{
		{[]string{"STRATEGY=redis-lock", "REDIS_ADDRS=" + lru}, []string{lru, "maxmemory-policy is allkeys-lru", "noeviction"}},
		{[]string{"STRATEGY=redlock", "REDIS_ADDRS=" + good + "," + lru}, []string{lru, "maxmemory-policy is allkeys-lru", "noeviction"}},
		{[]string{"STRATEGY=redis-lock", "REDIS_ADDRS=" + noConfig}, []string{noConfig, "CONFIG", "REDIS_SKIP_POLICY_CHECK=1"}},
		// The override covers a policy that cannot be read, not a wrong one.
		{[]string{"STRATEGY=redis-lock", "REDIS_ADDRS=" + lru, "REDIS_SKIP_POLICY_CHECK=1"}, []string{"maxmemory-policy is allkeys-lru"}},
	} {
		line := refusal(t, append([]string{db}, c.env...)...)
		t.Logf("%v: %s", c.env, line)
		for _, w := range c.want {
			if !strings.Contains(line, w) {
				t.Errorf("%v: the refusal %q does not say %q", c.env, line, w)
			}
		}
	}
	startInstance(t, db, "STRATEGY=redis-lock", "REDIS_ADDRS="+noConfig, "REDIS_SKIP_POLICY_CHECK=1")
	startInstance(t, db, "STRATEGY=redlock", "REDIS_ADDRS="+good+","+startRedisServers(t, 1))
}

// refusal runs the binary with env, expects it to refuse to start, and
// returns its error: the one line on stderr that starts with "stock:".
func refusal(t *testing.T, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, buildBinary(t))
	cmd.Env = append(os.Environ(), append([]string{"HTTP_ADDR=127.0.0.1:0", "LOG_LEVEL=warn"}, env...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); ctx.Err() != nil || err == nil {
		t.Errorf("%v: started (%v), want a refusal", env, err)
		return ""
	}
	var lines []string
	for _, l := range strings.Split(stderr.String(), "\n") {
		if strings.HasPrefix(l, "stock: ") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 {
		t.Errorf("%v: %d error lines, want one:\n%s", env, len(lines), stderr.String())
		return ""
	}
	return lines[0]
}
