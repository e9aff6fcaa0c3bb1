// Package envconf reads configuration from environment variables and
// collects every invalid value, so that a command can refuse to start with
// one line that names all of them.
package envconf

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Reader reads variables through getenv. A value that does not parse is
// reported through Err and replaced by the default.
type Reader struct {
	getenv func(string) string
	errs   []string
}

// New returns a Reader over getenv (os.Getenv, or a map in tests).
func New(getenv func(string) string) *Reader { return &Reader{getenv: getenv} }

// Bad records a problem found by the caller.
func (r *Reader) Bad(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// String returns the trimmed value of name, or def when it is empty.
func (r *Reader) String(name, def string) string {
	if v := strings.TrimSpace(r.getenv(name)); v != "" {
		return v
	}
	return def
}

// Int returns name as an integer from lo to hi, or def when it is empty.
func (r *Reader) Int(name string, def, lo, hi int) int {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		r.Bad("%s=%q is not an integer from %d to %d", name, v, lo, hi)
		return def
	}
	return n
}

// Duration returns name as a positive duration (or zero, when allowZero),
// or def when it is empty.
func (r *Reader) Duration(name string, def time.Duration, allowZero bool) time.Duration {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || (d == 0 && !allowZero) {
		r.Bad("%s=%q is not a positive duration such as 3s or 250ms", name, v)
		return def
	}
	return d
}

// Bool returns name as true/false (also 1/0, yes/no), or def when it is
// empty.
func (r *Reader) Bool(name string, def bool) bool {
	v := strings.ToLower(r.String(name, ""))
	switch v {
	case "":
		return def
	case "yes":
		return true
	case "no":
		return false
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.Bad("%s=%q is not true or false", name, v)
		return def
	}
	return b
}

// Err returns every problem found, in one error, or nil.
func (r *Reader) Err() error {
	if len(r.errs) == 0 {
		return nil
	}
	return errors.New("invalid configuration: " + strings.Join(r.errs, "; "))
}
