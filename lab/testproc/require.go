package testproc

import (
	"errors"
	"os"
	"testing"
)

// Require is how every test server's helper ends a failed start: it skips
// tb when err says a server's binary is missing (missing), unless CI=true
// (CI must never pass because a server was missing), and fails tb on any
// other error. Nothing happens when err is nil.
func Require(tb testing.TB, err, missing error) {
	tb.Helper()
	if err == nil {
		return
	}
	if errors.Is(err, missing) && os.Getenv("CI") != "true" {
		tb.Skip(err, "(set CI=true to make this a failure)")
	}
	tb.Fatal(err)
}
