package main

import (
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"
)

// bar is one bar of a chart.
type bar struct {
	Label  string
	Value  float64
	Note   string // printed after the value
	Family string // "bento", "peer" or "bare", "-light" added for a paler shade: picks the colour
}

var barColors = map[string]string{
	"bento": "#2b6cb0", "peer": "#dd6b20", "bare": "#718096",
	"bento-light": "#90cdf4", "peer-light": "#fbd38d", "bare-light": "#cbd5e0",
}

// chartSpec describes a horizontal bar chart.
type chartSpec struct {
	Title, Subtitle string
	Axis            string               // the axis caption
	Format          func(float64) string // a bar's value; nil: thousands + "/s"
	Log             bool                 // a logarithmic axis, for values spanning decades
	Bars            []bar
}

// drainChart draws the drain chart: rows per second on a linear axis.
func drainChart(title, subtitle string, bars []bar) string {
	return barChart(chartSpec{Title: title, Subtitle: subtitle, Axis: "rows per second (higher is better)", Bars: bars})
}

// axis maps values to x offsets in [0, width] and lists the tick values.
type axis struct {
	lo, hi float64
	log    bool
	ticks  []float64
}

// newAxis fits an axis to values up to maxV (and, on a log axis, down to
// minV): a linear one from 0 in steps of 1, 2 or 5 times a power of ten, a
// logarithmic one between the powers of ten around the values.
func newAxis(minV, maxV float64, log bool) axis {
	if log {
		minV, maxV = math.Max(minV, 1e-9), math.Max(maxV, 1e-9)
		lo := math.Pow(10, math.Floor(math.Log10(minV)))
		hi := math.Pow(10, math.Ceil(math.Log10(maxV)))
		if hi <= lo {
			hi = lo * 10
		}
		a := axis{lo: lo, hi: hi, log: true}
		for v := lo; v <= hi*1.0001; v *= 10 {
			a.ticks = append(a.ticks, v)
		}
		return a
	}
	step := niceStep(maxV / 5)
	a := axis{hi: math.Max(step, math.Ceil(maxV/step)*step)}
	for v := 0.0; v <= a.hi+step/2; v += step {
		a.ticks = append(a.ticks, v)
	}
	return a
}

// x returns v's offset on an axis width wide, at least 1 so a bar shows.
func (a axis) x(v, width float64) float64 {
	var f float64
	if a.log {
		f = (math.Log10(math.Max(v, a.lo)) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	} else {
		f = v / a.hi
	}
	return math.Max(1, f*width)
}

// tickLabel formats an axis value: thousands, or a short decimal below 1.
func tickLabel(v float64) string {
	if v > 0 && v < 1 {
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return thousands(v)
}

// barChart draws a horizontal bar chart as standalone SVG, written by
// hand: a title, a subtitle, one labelled bar per value and an axis.
func barChart(c chartSpec) string {
	const (
		labelW   = 330 // left column for the bar labels
		plotW    = 420.0
		barH     = 26
		gap      = 12
		top      = 74
		axisH    = 40
		fontSize = 13
		charW    = 7.4 // a generous average glyph width at fontSize
	)
	format := c.Format
	if format == nil {
		format = func(v float64) string { return thousands(v) + "/s" }
	}
	bars := c.Bars
	maxV, minV := 0.0, math.Inf(1)
	for _, b := range bars {
		maxV = math.Max(maxV, b.Value)
		if b.Value > 0 {
			minV = math.Min(minV, b.Value)
		}
	}
	if math.IsInf(minV, 1) {
		minV = 1
	}
	ax := newAxis(minV, maxV, c.Log)
	x0 := float64(labelW)

	values := make([]string, len(bars))
	width := labelW + plotW + 40
	for i, b := range bars {
		values[i] = format(b.Value)
		if b.Note != "" {
			values[i] += " · " + b.Note
		}
		end := x0 + ax.x(b.Value, plotW) + 6 + float64(len([]rune(values[i])))*charW + 16
		width = math.Max(width, end)
	}
	width = math.Max(width, float64(len([]rune(c.Subtitle)))*charW+32)
	w := int(math.Ceil(width))
	height := top + len(bars)*(barH+gap) + axisH

	var s strings.Builder
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="%d">`+"\n",
		w, height, w, height, fontSize)
	fmt.Fprintf(&s, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", w, height)
	fmt.Fprintf(&s, `<text x="16" y="28" font-size="17" font-weight="bold" fill="#1a202c">%s</text>`+"\n", esc(c.Title))
	fmt.Fprintf(&s, `<text x="16" y="50" fill="#4a5568">%s</text>`+"\n", esc(c.Subtitle))

	plotBottom := top + len(bars)*(barH+gap) - gap/2
	for _, v := range ax.ticks {
		x := x0 + v/ax.hi*plotW
		if ax.log {
			x = x0 + (math.Log10(v)-math.Log10(ax.lo))/(math.Log10(ax.hi)-math.Log10(ax.lo))*plotW
		}
		fmt.Fprintf(&s, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e2e8f0"/>`+"\n", x, top-6, x, plotBottom)
		fmt.Fprintf(&s, `<text x="%.1f" y="%d" text-anchor="middle" fill="#4a5568">%s</text>`+"\n", x, plotBottom+18, tickLabel(v))
	}
	fmt.Fprintf(&s, `<text x="%.1f" y="%d" text-anchor="middle" fill="#4a5568">%s</text>`+"\n",
		x0+plotW/2, plotBottom+36, esc(c.Axis))

	for i, b := range bars {
		y := top + i*(barH+gap)
		bw := ax.x(b.Value, plotW)
		color := barColors[b.Family]
		if color == "" {
			color = "#4a5568"
		}
		fmt.Fprintf(&s, `<text x="%d" y="%d" text-anchor="end" fill="#1a202c">%s</text>`+"\n", labelW-10, y+barH/2+5, esc(b.Label))
		fmt.Fprintf(&s, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x0, y, bw, barH, color)
		fmt.Fprintf(&s, `<text x="%.1f" y="%d" fill="#1a202c">%s</text>`+"\n", x0+bw+6, y+barH/2+5, esc(values[i]))
	}
	s.WriteString("</svg>\n")
	return s.String()
}

// niceStep rounds raw up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

// thousands formats v rounded to an integer with comma separators.
func thousands(v float64) string {
	n := int64(math.Round(v))
	neg := n < 0
	if neg {
		n = -n
	}
	digits := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func esc(s string) string { return html.EscapeString(s) }
