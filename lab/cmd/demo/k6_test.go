package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fakeK6 is a stand-in for k6 (pure logic of the runner, no load): it
// exits with CannotStartRESTAPI on its first `fail` runs, as k6 does when
// the port of its REST API was taken, and then writes an empty summary
// where SUMMARY_JSON says and exits 0. Each run appends its --address to
// the file "addresses" beside it.
const fakeK6 = `#!/bin/sh
dir=$(dirname "$0")
runs=$(cat "$dir/runs" 2>/dev/null || echo 0)
runs=$((runs + 1))
echo "$runs" > "$dir/runs"
summary=
while [ $# -gt 0 ]; do
  case "$1" in
    --address) echo "$2" >> "$dir/addresses"; shift ;;
    SUMMARY_JSON=*) summary=${1#SUMMARY_JSON=} ;;
  esac
  shift
done
if [ "$runs" -le "$(cat "$dir/fail")" ]; then
  echo 'level=error msg="Error from API server" error="bind: address already in use"'
  exit 106
fi
echo '{"metrics":{}}' > "$summary"
`

func runFakeK6(t *testing.T, fail int) (k6Result, []string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "k6")
	if err := os.WriteFile(bin, []byte(fakeK6), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "fail"), []byte(strconv.Itoa(fail)), 0o644); err != nil {
		t.Fatal(err)
	}
	k := &k6Runner{bin: bin, loadtestDir: dir, progress: newProgress(io.Discard, 1)}
	res := k.run(context.Background(), k6Job{Label: "fake", Script: "fake.js", Dir: filepath.Join(dir, "run")})
	addrs, err := os.ReadFile(filepath.Join(dir, "addresses"))
	if err != nil {
		t.Fatal(err)
	}
	return res, strings.Fields(string(addrs))
}

// TestK6RunIsRetriedWhenItsAPIPortIsTaken: a run that k6 could not start
// because another process took the port picked for its REST API (a demo
// lost a row of its report to it) is run again on a fresh port.
func TestK6RunIsRetriedWhenItsAPIPortIsTaken(t *testing.T) {
	res, addrs := runFakeK6(t, 2)
	if res.Err != nil || res.ExitCode != 0 || res.Summary == nil {
		t.Fatalf("after two refused starts: %+v", res)
	}
	if len(addrs) != 3 || addrs[0] == "127.0.0.1:0" {
		t.Fatalf("k6 was started with addresses %v, want three picked ports", addrs)
	}
	if !strings.Contains(res.Command, addrs[2]) {
		t.Errorf("the command %q does not name the port of the run that counted, %s", res.Command, addrs[2])
	}
}

// TestK6RunGivesUpAfterThreeRefusedStarts: the retries are bounded, and
// the failure is reported with k6's exit code.
func TestK6RunGivesUpAfterThreeRefusedStarts(t *testing.T) {
	res, addrs := runFakeK6(t, 9)
	if len(addrs) != 3 {
		t.Fatalf("%d starts, want 3", len(addrs))
	}
	if res.ExitCode != k6CannotStartRESTAPI || res.Err == nil {
		t.Fatalf("after three refused starts: exit %d, err %v; want %d and an error", res.ExitCode, res.Err, k6CannotStartRESTAPI)
	}
}
