package main

import (
	"context"
	"net/url"
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
	opts, err := cli.NewProjectOptions([]string{"../../docker-compose.yml"},
		cli.WithWorkingDirectory("../.."), cli.WithEnv(env), cli.WithName("stock"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml does not load: %v", err)
	}
	return p
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
		nil,
		{"STRATEGY=redlock"},
		{"STRATEGY=for-update", "DATABASE_URL=mysql://root@mysql:3306/stock"},
	} {
		p := loadCompose(t, env...)
		for _, name := range []string{"postgres", "mysql", "redis1", "redis2", "redis3", "redis4", "redis5", "stock"} {
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
		for _, addr := range cfg.RedisAddrs {
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
			for _, want := range []string{"--appendonly yes", "--maxmemory-policy noeviction"} {
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
