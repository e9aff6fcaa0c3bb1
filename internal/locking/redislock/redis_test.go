package redislock_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/flashsale/stock/lab/testredis"
)

// shared is a server started by TestMain for the Examples (which cannot
// skip) and for tests that need no node failures; tests that stop nodes start
// their own with startRedis. exampleServers are three more for ExampleRedlock.
var (
	shared         *redisServer
	exampleServers []*redisServer
)

// TestMain starts the shared server. Without redis-server the whole package
// is skipped with a message (Examples could not skip one by one), except on
// CI (CI=true), where a missing server fails the run.
func TestMain(m *testing.M) {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "locking tests:", err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "locking-redis-")
	if err != nil {
		fail(err)
	}
	var servers []*redisServer
	stopAll := func() {
		for _, s := range servers {
			s.Stop()
		}
		_ = os.RemoveAll(dir)
	}
	for i := range 4 {
		sub := fmt.Sprintf("%s/%d", dir, i)
		if err := os.Mkdir(sub, 0o755); err != nil {
			stopAll()
			fail(err)
		}
		s, err := testredis.Spawn(sub, 0)
		if err != nil {
			stopAll()
			if errors.Is(err, testredis.ErrNoRedis) && os.Getenv("CI") != "true" {
				fmt.Println("SKIP: locking tests need", testredis.Bin+":", err)
				os.Exit(0)
			}
			fail(err)
		}
		servers = append(servers, s)
	}
	shared, exampleServers = servers[0], servers[1:]
	code := m.Run()
	stopAll()
	os.Exit(code)
}

// redisServer is a redis-server child process on a free loopback port,
// stopped by its own PID; see lab/testredis.
type redisServer = testredis.Server

// startRedis starts a redis-server for tb; see testredis.Start.
func startRedis(tb testing.TB) *redisServer { return testredis.Start(tb) }

// uniqueKey is a lock name no other test (or run, with -count) uses.
func uniqueKey(tb testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return strings.ReplaceAll(tb.Name(), "/", "_") + "-" + hex.EncodeToString(b[:])
}

// errorSink collects failures from spawned goroutines; the test goroutine
// reports them (t.Fatal must not run on other goroutines).
type errorSink struct {
	mu   sync.Mutex
	errs []error
}

func (s *errorSink) Add(err error) {
	if err == nil {
		return
	}
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
}

func (s *errorSink) Addf(format string, args ...any) { s.Add(fmt.Errorf(format, args...)) }

func (s *errorSink) Report(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, err := range s.errs {
		if i == 10 {
			tb.Errorf("... and %d more", len(s.errs)-10)
			break
		}
		tb.Error(err)
	}
	if len(s.errs) > 0 {
		tb.FailNow()
	}
}
