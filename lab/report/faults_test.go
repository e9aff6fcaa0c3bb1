package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadFaults(t *testing.T) {
	root := t.TempDir()
	run := filepath.Join(root, "faults", "20261122-010000")
	if err := os.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("20261122-010000", filepath.Join(root, "faults", "latest")); err != nil {
		t.Fatal(err)
	}
	json := `{"version":1,"started":"2026-11-22T01:00:00Z","verdict":"ok","runs":[
		{"scenario":2,"name":"2-paused-holder/redis-lock/fencing-off","title":"a lock holder paused","verdict":"expected-oversell","line":"EXPECTED-OVERSELL 2-paused-holder/redis-lock/fencing-off   oversold=1","figures":{"requests":5}}]}`
	if err := os.WriteFile(filepath.Join(run, "faults.json"), []byte(json), 0o644); err != nil {
		t.Fatal(err)
	}
	reportDir := filepath.Join(root, "20261122-020000")
	f, err := LoadFaults(filepath.Join(root, "faults", "latest"), reportDir)
	if err != nil {
		t.Fatal(err)
	}
	if f == nil || f.Verdict != "ok" || len(f.Runs) != 1 || f.Runs[0].Verdict != "expected-oversell" {
		t.Fatalf("loaded %+v", f)
	}
	if f.Runs[0].Line != "oversold=1" {
		t.Errorf("line %q: want the figures without verdict and name", f.Runs[0].Line)
	}
	if f.Link != "../faults/20261122-010000/faults.md" {
		t.Errorf("link %q: want it relative to the report and through the symlink", f.Link)
	}
	if none, err := LoadFaults(filepath.Join(root, "nowhere"), reportDir); none != nil || err != nil {
		t.Errorf("no suite run: %v, %v; want nil, nil", none, err)
	}
	if err := os.WriteFile(filepath.Join(run, "faults.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFaults(filepath.Join(root, "faults", "latest"), reportDir); err == nil || !strings.Contains(err.Error(), "faults.json") {
		t.Errorf("a broken faults.json: %v", err)
	}
}
