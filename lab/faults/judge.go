package faults

import (
	"os"
	"testing"
)

// Judge holds tb to what make test asks of a short run: a run skipped for
// a missing server skips tb (fails it under CI=true: CI must never pass
// because a server was missing); an error or a failed check fails it, as
// does a safe configuration that oversold or a run that sold nothing. A
// degraded run is logged: availability on a loaded 2-core machine is not
// what the short runs prove; make faults reports it.
func Judge(tb testing.TB, r Result) {
	tb.Helper()
	switch r.Verdict {
	case VerdictSkipped:
		if os.Getenv("CI") == "true" {
			tb.Fatalf("CI=true and %s", r.Error)
		}
		tb.Skipf("%s (set CI=true to make this a failure)", r.Error)
	case VerdictError, VerdictFailed:
		tb.Errorf("%s\nfailures: %q\nerror: %s", r.Line, r.Failures, r.Error)
	case VerdictDegraded:
		tb.Logf("degraded: %q", r.Warnings)
	}
	if r.Config.Safe && r.Figures.OversoldUnits != 0 {
		tb.Errorf("a safe configuration oversold %d units", r.Figures.OversoldUnits)
	}
	if r.Figures.Created == 0 {
		tb.Errorf("nothing was sold: %s", r.Line)
	}
}
