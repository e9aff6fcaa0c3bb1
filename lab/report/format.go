package report

import (
	"fmt"

	"math"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/strategies"
)

// Strategy explains what a strategy does, for readers who know SQL but not
// this code base.
type Strategy struct {
	Name    string
	Safe    bool
	How     string
	Expect  string
	Unknown bool
}

// DescribeStrategy returns what the report says about a strategy: the
// registry's words (internal/strategies). An unknown name still gets a row,
// with a note.
func DescribeStrategy(name string) Strategy {
	if s, ok := strategies.Lookup(name); ok {
		return Strategy{Name: s.Name, Safe: s.Safe(), How: s.How, Expect: s.Expect}
	}
	return Strategy{Name: name, Safe: !IsControl(name), Unknown: true,
		How: "A strategy this report has no description of; see the service's docs/strategies.md."}
}

// fmtInt writes 1234567 as 1,234,567.
func fmtInt(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "−" + b.String()
	}
	return b.String()
}

// fmtRate writes a per-second figure: whole numbers with separators, one
// decimal under 100.
func fmtRate(v float64) string {
	switch {
	case v <= 0 || math.IsNaN(v):
		return "–"
	case v < 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return fmtInt(int64(math.Round(v)))
}

// fmtDur writes a latency readably: 0.8 ms, 12.3 ms, 172 ms, 1.04 s.
func fmtDur(d time.Duration) string {
	msf := float64(d) / float64(time.Millisecond)
	switch {
	case d <= 0:
		return "–"
	case msf < 10:
		return strconv.FormatFloat(msf, 'f', 1, 64) + " ms"
	case msf < 1000:
		return strconv.FormatFloat(msf, 'f', 0, 64) + " ms"
	}
	return strconv.FormatFloat(msf/1000, 'f', 2, 64) + " s"
}

// fmtRatio writes a ratio as 0.43× (two significant digits).
func fmtRatio(v float64) string {
	if v <= 0 {
		return "–"
	}
	if v >= 10 {
		return strconv.FormatFloat(v, 'f', 0, 64) + "×"
	}
	return strconv.FormatFloat(round(v, 2), 'f', -1, 64) + "×"
}

// fmtMillis writes a latency in milliseconds without its unit, for a
// column whose header has it: 0.8, 42, 1,650; "–" for none.
func fmtMillis(d time.Duration) string {
	msf := float64(d) / float64(time.Millisecond)
	switch {
	case d <= 0:
		return "–"
	case msf < 10:
		return strconv.FormatFloat(msf, 'f', 1, 64)
	}
	return fmtInt(int64(math.Round(msf)))
}

// fmtSeconds writes a window: 1.72 s, 15.0 s.
func fmtSeconds(d time.Duration) string {
	if d <= 0 {
		return "–"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + " s"
}

// StatusText is the verdict as a table shows it.
func StatusText(v Verdict) string {
	switch v.Status {
	case StatusOK:
		return "OK"
	case StatusFail:
		return "FAIL"
	case StatusError:
		return "ERROR"
	case StatusControlOversold:
		return "oversold (control)"
	case StatusControlHeld:
		return "no oversell (control)"
	case StatusUnsupported:
		return "not yet supported (issue 25 slice 5)"
	}
	return string(v.Status)
}

func conservationText(v Verdict) string {
	if v.Status == StatusError {
		return "–"
	}
	if v.Conserved && v.Unconfirmed == 0 {
		return "OK"
	}
	return "NO"
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%s %s", fmtInt(n), one)
	}
	return fmt.Sprintf("%s %s", fmtInt(n), many)
}
