package main

import (
	"context"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

// loadCompose loads docker-compose.yml the way Docker Compose does, with the
// given environment for its ${…} defaults. No Docker engine runs here, so
// this is what keeps the file true to the code.
func loadCompose(t *testing.T, env ...string) *types.Project {
	t.Helper()
	p, err := tryLoadCompose(env...)
	if err != nil {
		t.Fatalf("docker-compose.yml does not load: %v", err)
	}
	return p
}

func tryLoadCompose(env ...string) (*types.Project, error) {
	opts, err := cli.NewProjectOptions([]string{"../../docker-compose.yml"},
		cli.WithWorkingDirectory("../.."), cli.WithEnv(env), cli.WithName("stock"))
	if err != nil {
		return nil, err
	}
	return opts.LoadProject(context.Background())
}

// composeToken is an admin token long enough for the service.
const composeToken = "ADMIN_TOKEN=compose-admin-token-0123"

// TestComposeRequiresAdminToken: compose refuses to start without an
// ADMIN_TOKEN (there is no default such as "change-me" for anyone to
// guess), and a short one is refused by the service itself.
func TestComposeRequiresAdminToken(t *testing.T) {
	for _, env := range [][]string{nil, {"ADMIN_TOKEN="}} {
		_, err := tryLoadCompose(env...)
		if err == nil || !strings.Contains(err.Error(), "set ADMIN_TOKEN to 16+ characters") {
			t.Errorf("env %v: loaded (%v), want compose to require ADMIN_TOKEN", env, err)
		}
	}
	p := loadCompose(t, "ADMIN_TOKEN=change-me")
	svc, _ := p.GetService("stock")
	vars := map[string]string{}
	for k, v := range svc.Environment {
		if v != nil {
			vars[k] = *v
		}
	}
	if _, err := loadConfig(func(k string) string { return vars[k] }); err == nil || !strings.Contains(err.Error(), "ADMIN_TOKEN") {
		t.Errorf("ADMIN_TOKEN=change-me through compose: %v, want the service to refuse it", err)
	}
}

// TestDockerImageRunsAsNonRoot: the image's last stage sets a USER that is
// not root.
func TestDockerImageRunsAsNonRoot(t *testing.T) {
	raw, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	user := ""
	for _, line := range strings.Split(string(raw), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		switch strings.ToUpper(fields[0]) {
		case "FROM":
			user = "" // a new stage starts as root again
		case "USER":
			user = fields[1]
		}
	}
	name, _, _ := strings.Cut(user, ":")
	if name == "" || name == "root" || name == "0" {
		t.Errorf("the image runs as %q, want a non-root USER in its last stage", user)
	}
}

// readVariables lists every variable loadConfig reads.
func readVariables() []string {
	var names []string
	_, _ = loadConfig(func(name string) string {
		names = append(names, name)
		return ""
	})
	return names
}

func TestComposeFileMatchesTheCode(t *testing.T) {
	for _, env := range [][]string{
		{composeToken},
		{composeToken, "STRATEGY=redlock"},
		{composeToken, "STRATEGY=etcd-lock"},
		{composeToken, "STRATEGY=zk-lock"},
		{composeToken, "STRATEGY=db-lock"},
		{composeToken, "STRATEGY=conditional", "ADMISSION_LIMIT=4"},
		{composeToken, "STRATEGY=redis-reserve"},
		{composeToken, "STRATEGY=redis-watch"},
		{composeToken, "STRATEGY=for-update", "DATABASE_URL=mysql://root@mysql:3306/stock"},
	} {
		p := loadCompose(t, env...)
		for _, name := range []string{"postgres", "mysql", "redis1", "redis2", "redis3", "redis4", "redis5",
			"etcd1", "etcd2", "etcd3", "zookeeper", "stock"} {
			if _, err := p.GetService(name); err != nil {
				t.Fatalf("service %s: %v", name, err)
			}
		}
		mysqlSvc, _ := p.GetService("mysql")
		if !strings.HasPrefix(mysqlSvc.Image, "mysql:8") {
			t.Errorf("mysql image %q, want MySQL 8", mysqlSvc.Image)
		}
		svc, _ := p.GetService("stock")
		vars := map[string]string{}
		known := readVariables()
		for k, v := range svc.Environment {
			if !slices.Contains(known, k) {
				t.Errorf("the stock service sets %s, which the service does not read (it reads %v)", k, known)
			}
			if v != nil {
				vars[k] = *v
			}
		}
		cfg, err := loadConfig(func(k string) string { return vars[k] })
		if err != nil {
			t.Fatalf("env %v: the compose environment is not a valid configuration: %v", env, err)
		}
		// Every backend the service is pointed at is a service of the file.
		u, err := url.Parse(cfg.DatabaseURL)
		if err != nil {
			t.Fatal(err)
		}
		hosts := []string{u.Hostname()}
		for _, addr := range slices.Concat(cfg.RedisAddrs, cfg.EtcdEndpoints, cfg.ZKServers) {
			hosts = append(hosts, strings.Split(addr, ":")[0])
		}
		for _, h := range hosts {
			if _, err := p.GetService(h); err != nil {
				t.Errorf("the service is pointed at %s, which docker-compose.yml does not define", h)
			}
			if _, ok := svc.DependsOn[h]; !ok {
				t.Errorf("the stock service does not wait for %s (depends_on)", h)
			}
		}
		if len(cfg.RedisAddrs) != 5 {
			t.Errorf("REDIS_ADDRS has %d servers, want the five of the file", len(cfg.RedisAddrs))
		}
		// etcd-lock's cluster is the file's three members: one lost member
		// must not stop sales.
		if len(cfg.EtcdEndpoints) != 3 {
			t.Errorf("ETCD_ENDPOINTS has %d members, want the three of the file", len(cfg.EtcdEndpoints))
		}
		// The fencing counters must survive a restart and memory pressure:
		// persistence on a volume, and no eviction (the service refuses
		// any other policy at start).
		for _, addr := range cfg.RedisAddrs {
			name := strings.Split(addr, ":")[0]
			r, err := p.GetService(name)
			if err != nil {
				continue // reported above
			}
			cmd := strings.Join(r.Command, " ")
			// redis-reserve answers 201 only for an order on disk.
			for _, want := range []string{"--appendonly yes", "--appendfsync always", "--maxmemory-policy noeviction"} {
				if !strings.Contains(cmd, want) {
					t.Errorf("%s runs %q, without %s", name, cmd, want)
				}
			}
			if !slices.ContainsFunc(r.Volumes, func(v types.ServiceVolumeConfig) bool { return v.Target == "/data" && v.Source != "" }) {
				t.Errorf("%s keeps /data on no named volume: its fencing counters do not survive the container", name)
			}
		}
	}
}
