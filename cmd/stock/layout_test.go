package main

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoFiles walks the repository from its root (two folders up) and calls
// visit with each Go file's path relative to the root.
func repoFiles(t *testing.T, visit func(rel string)) {
	t.Helper()
	root := "../.."
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata" || d.Name() == "reports") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			visit(filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestServiceImportsNoLabCode: the service binary is built from the
// service's half of the tree alone; the tools that measure it (lab/) stand
// apart.
func TestServiceImportsNoLabCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/flashsale/stock/lab/") {
			t.Errorf("cmd/stock imports %s", pkg)
		}
	}
}

// TestNoSourceFileAboveSixHundredLines: a file reads in a sitting; one
// that outgrows it is split where its parts are.
func TestNoSourceFileAboveSixHundredLines(t *testing.T) {
	repoFiles(t, func(rel string) {
		if strings.HasSuffix(rel, "_test.go") {
			return
		}
		b, err := os.ReadFile(filepath.Join("../..", rel))
		if err != nil {
			t.Fatal(err)
		}
		if n := bytes.Count(b, []byte("\n")); n > 600 {
			t.Errorf("%s has %d lines, more than 600", rel, n)
		}
	})
}

// TestNoSwitchOnAStrategyName: every place that needs something of each
// strategy loops over the registry's entries (internal/strategies), so a
// new strategy is its file and its entry; none chooses by name.
func TestNoSwitchOnAStrategyName(t *testing.T) {
	arm := regexp.MustCompile(`case (strategies|inventory|sqlrow|batched|reservation)\.Name`)
	repoFiles(t, func(rel string) {
		if strings.HasPrefix(rel, "internal/strategies/") {
			return
		}
		f, err := os.Open(filepath.Join("../..", rel))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for n := 1; sc.Scan(); n++ {
			if arm.MatchString(sc.Text()) {
				t.Errorf("%s:%d switches on a strategy's name: %s", rel, n, strings.TrimSpace(sc.Text()))
			}
		}
	})
}

// TestTestFilesAreNamedByBehaviour: a test file says what it pins, not
// which review found it (history belongs in commit messages).
func TestTestFilesAreNamedByBehaviour(t *testing.T) {
	repoFiles(t, func(rel string) {
		if base := filepath.Base(rel); strings.HasSuffix(base, "_test.go") && strings.Contains(base, "review") {
			t.Errorf("%s is named after a review", rel)
		}
	})
}
