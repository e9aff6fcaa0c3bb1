package report

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"strconv"
	"strings"
)

// The charts are plain inline SVG written here, styled by the page's CSS
// classes: no script, no CDN, nothing to load, so the page opens offline
// and prints.

// bar is one bar of a chart row.
type bar struct {
	Value float64
	// Text is printed after the bar; Title is its tooltip.
	Text, Title string
	// Class picks the fill (see the page's CSS).
	Class string
}

// barRow is one labelled row: several bars side by side (or stacked).
type barRow struct {
	Label, Sub string
	Bars       []bar
	// Class styles the label (e.g. the control's in red).
	Class string
}

// refLine is a vertical reference line, such as a ceiling.
type refLine struct {
	Label string
	Value float64
	Class string
}

type legendItem struct{ Label, Class string }

type chart struct {
	Title string
	// Note is a line under the title the reader must not miss (what the
	// bars do not compare like with like).
	Note    string
	Unit    string
	Rows    []barRow
	Refs    []refLine
	Legend  []legendItem
	Log     bool // log10 axis (latencies spanning decades)
	Stacked bool // the bars of a row continue each other
	// Format writes an axis tick.
	Format func(float64) string
	// Width of the drawing in its own units; the page scales it to its
	// box. Default 640.
	Width int
}

const (
	defaultWidth = 640
	labelWidth   = 150
	valueSpace   = 130 // room right of the longest bar for its text
	barHeight    = 13
	barGap       = 2
	rowGap       = 12
)

// render draws the chart as an <svg> element.
func (c chart) render() template.HTML {
	if len(c.Rows) == 0 {
		return ""
	}
	chartWidth := c.Width
	if chartWidth == 0 {
		chartWidth = defaultWidth
	}
	format := c.Format
	if format == nil {
		format = fmtTick
	}
	// The scale's domain.
	hi, lo := 0.0, math.Inf(1)
	for _, r := range c.Rows {
		sum := 0.0
		for _, b := range r.Bars {
			if b.Value > 0 {
				lo = math.Min(lo, b.Value)
			}
			if c.Stacked {
				sum += math.Max(b.Value, 0)
			} else {
				hi = math.Max(hi, b.Value)
			}
		}
		hi = math.Max(hi, sum)
	}
	for _, ref := range c.Refs {
		hi = math.Max(hi, ref.Value)
	}
	if hi <= 0 {
		hi = 1
	}
	var ticks []float64
	var x func(v float64) float64
	// Room right of the plot for the longest text printed after a bar,
	// so that none is cut at the drawing's edge.
	plotX0, plotX1 := float64(labelWidth+8), float64(chartWidth)-max(valueSpace, c.longestValueText())
	if c.Log {
		if math.IsInf(lo, 1) {
			lo = 1
		}
		d0 := math.Floor(math.Log10(lo))
		d1 := math.Max(math.Ceil(math.Log10(hi)), d0+1)
		x = func(v float64) float64 {
			if v <= 0 {
				return plotX0
			}
			f := (math.Log10(v) - d0) / (d1 - d0)
			return plotX0 + math.Max(0, math.Min(1, f))*(plotX1-plotX0)
		}
		for d := d0; d <= d1; d++ {
			ticks = append(ticks, math.Pow(10, d))
		}
	} else {
		step := niceStep(hi / 5)
		top := math.Ceil(hi/step) * step
		x = func(v float64) float64 { return plotX0 + math.Max(0, v)/top*(plotX1-plotX0) }
		for t := 0.0; t <= top+step/2; t += step {
			ticks = append(ticks, t)
		}
	}

	var b strings.Builder
	y := 30.0
	legendY := 27.0
	if c.Note != "" {
		y += 16
		legendY += 16
	}
	if len(c.Legend) > 0 {
		y += 18
	}
	// Each reference line gets a line of its own for its label, above the
	// plot, so that close values do not print over each other.
	refTop := y + 4
	y += float64(len(c.Refs)) * 14
	top := y
	var body strings.Builder
	for _, r := range c.Rows {
		n := len(r.Bars)
		if c.Stacked {
			n = 1
		}
		bars := float64(n*barHeight + (n-1)*barGap)
		// A row with a second line under its label is at least as tall
		// as the two lines, its bars centred on them.
		h := bars
		if r.Sub != "" {
			h = math.Max(h, 26)
		}
		fmt.Fprintf(&body, `<text class="row-label %s" x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`,
			r.Class, labelWidth, y+h/2-(map[bool]float64{true: 6, false: 0}[r.Sub != ""]), esc(r.Label))
		if r.Sub != "" {
			fmt.Fprintf(&body, `<text class="row-sub" x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`,
				labelWidth, y+h/2+7, esc(r.Sub))
		}
		barsTop := y + (h-bars)/2
		by, bx := barsTop, plotX0
		var stackText []string
		for _, bb := range r.Bars {
			if c.Stacked {
				if bb.Value <= 0 {
					continue
				}
				w := x(bb.Value) - plotX0
				fmt.Fprintf(&body, `<rect class="%s" x="%.1f" y="%.1f" width="%.1f" height="%d"><title>%s</title></rect>`,
					bb.Class, bx, by, math.Max(w, 1), barHeight, esc(bb.Title))
				bx += w
				if bb.Text != "" {
					stackText = append(stackText, bb.Text)
				}
				continue
			}
			w := x(bb.Value) - plotX0
			if bb.Value > 0 {
				fmt.Fprintf(&body, `<rect class="%s" x="%.1f" y="%.1f" width="%.1f" height="%d"><title>%s</title></rect>`,
					bb.Class, plotX0, by, math.Max(w, 1), barHeight, esc(bb.Title))
			}
			fmt.Fprintf(&body, `<text class="value" x="%.1f" y="%.1f" dominant-baseline="middle">%s</text>`,
				plotX0+math.Max(w, 0)+4, by+barHeight/2+0.5, esc(bb.Text))
			by += barHeight + barGap
		}
		if c.Stacked && len(stackText) > 0 {
			fmt.Fprintf(&body, `<text class="value" x="%.1f" y="%.1f" dominant-baseline="middle">%s</text>`,
				bx+4, barsTop+barHeight/2+0.5, esc(strings.Join(stackText, " + ")))
		}
		y += h + rowGap
	}
	bottom := y - rowGap + 6

	height := bottom + 34
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %.0f" width="%d" height="%.0f" role="img" aria-label="%s" xmlns="http://www.w3.org/2000/svg">`,
		chartWidth, height, chartWidth, height, esc(c.Title))
	fmt.Fprintf(&b, `<text class="chart-title" x="0" y="16">%s</text>`, esc(c.Title))
	if c.Note != "" {
		fmt.Fprintf(&b, `<text class="chart-note" x="0" y="34">%s</text>`, esc(c.Note))
	}
	if len(c.Legend) > 0 {
		lx := float64(labelWidth + 8)
		for _, l := range c.Legend {
			fmt.Fprintf(&b, `<rect class="%s" x="%.1f" y="%.0f" width="12" height="10"/><text class="legend" x="%.1f" y="%.0f">%s</text>`,
				l.Class, lx, legendY, lx+16, legendY+9, esc(l.Label))
			lx += 16 + 7*float64(len([]rune(l.Label))) + 18
		}
	}
	// Grid and axis.
	for _, t := range ticks {
		tx := x(t)
		fmt.Fprintf(&b, `<line class="grid" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, tx, top-4, tx, bottom)
		fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, tx, bottom+14, esc(format(t)))
	}
	if c.Unit != "" {
		fmt.Fprintf(&b, `<text class="unit" x="%.1f" y="%.1f" text-anchor="end">%s</text>`, plotX1, bottom+28, esc(c.Unit))
	}
	b.WriteString(body.String())
	for i, ref := range c.Refs {
		rx := x(ref.Value)
		ly := refTop + float64(i)*14
		fmt.Fprintf(&b, `<line class="ref %s" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"><title>%s</title></line>`,
			ref.Class, rx, ly+3, rx, bottom, esc(ref.Label))
		anchor, tx := "end", rx-4
		if rx < plotX0+260 {
			anchor, tx = "start", rx+4
		}
		fmt.Fprintf(&b, `<text class="ref-label %s" x="%.1f" y="%.1f" text-anchor="%s" dominant-baseline="middle">%s</text>`,
			ref.Class, tx, ly+6, anchor, esc(ref.Label))
	}
	b.WriteString(`</svg>`)
	// Every text above went through esc; the markup is ours.
	return template.HTML(b.String())
}

// valueCharWidth is the widest a character of a value's text (11 px) gets
// in the page's fonts, in the drawing's units, with room to spare: digits
// and commas are about 6.2.
const valueCharWidth = 6.6

// longestValueText is the room the longest text after a bar needs.
func (c chart) longestValueText() float64 {
	longest := 0
	for _, r := range c.Rows {
		var texts []string
		for _, b := range r.Bars {
			if b.Text != "" {
				texts = append(texts, b.Text)
			}
		}
		if c.Stacked {
			texts = []string{strings.Join(texts, " + ")}
		}
		for _, t := range texts {
			longest = max(longest, len([]rune(t)))
		}
	}
	return float64(longest)*valueCharWidth + 8
}

// fmtTick writes an axis value: 0, 0.1, 50, 1,000. A tick is a sum of
// steps, so 0.6 can arrive as 0.6000000000000001: nine decimals at most.
func fmtTick(v float64) string {
	v = math.Round(v*1e9) / 1e9
	if v == math.Trunc(v) {
		return fmtInt(int64(v))
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

func esc(s string) string { return html.EscapeString(s) }

// niceStep rounds a raw tick step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}
