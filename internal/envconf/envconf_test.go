package envconf

import (
	"strings"
	"testing"
	"time"
)

func TestReader(t *testing.T) {
	env := map[string]string{
		"S": " x ", "N": "7", "BADN": "70", "D": "250ms", "Z": "0", "BADD": "soon",
		"B": "yes", "B0": "0", "BADB": "maybe",
	}
	r := New(func(k string) string { return env[k] })
	if r.String("S", "d") != "x" || r.String("MISSING", "d") != "d" {
		t.Error("String")
	}
	if r.Int("N", 1, 0, 10) != 7 || r.Int("BADN", 1, 0, 10) != 1 || r.Int("MISSING", 3, 0, 10) != 3 {
		t.Error("Int")
	}
	if r.Duration("D", time.Second, false) != 250*time.Millisecond || r.Duration("Z", time.Second, true) != 0 ||
		r.Duration("BADD", time.Second, false) != time.Second {
		t.Error("Duration")
	}
	if r.Duration("Z", time.Second, false) != time.Second {
		t.Error("a zero duration where none is allowed must fall back")
	}
	if !r.Bool("B", false) || r.Bool("B0", true) || !r.Bool("BADB", true) || !r.Bool("MISSING", true) {
		t.Error("Bool")
	}
	err := r.Err()
	if err == nil {
		t.Fatal("no error for four bad values")
	}
	for _, name := range []string{"BADN", "BADD", `Z="0"`, "BADB"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("%v does not name %s", err, name)
		}
	}
	if New(func(string) string { return "" }).Err() != nil {
		t.Error("nothing read, yet an error")
	}
}
