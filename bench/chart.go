package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// bar is one bar of the drain chart.
type bar struct {
	Label  string
	Value  float64 // rows per second
	Note   string  // printed after the value
	Family string  // "bento", "peer" or "bare": picks the colour
}

var barColors = map[string]string{"bento": "#2b6cb0", "peer": "#dd6b20", "bare": "#718096"}

// drainChart draws a horizontal bar chart as standalone SVG, written by
// hand: a title, a subtitle, one labelled bar per relay and an axis in
// rows per second.
func drainChart(title, subtitle string, bars []bar) string {
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
	maxV := 0.0
	for _, b := range bars {
		maxV = math.Max(maxV, b.Value)
	}
	step := niceStep(maxV / 5)
	axisMax := math.Max(step, math.Ceil(maxV/step)*step)
	scale := plotW / axisMax
	x0 := float64(labelW)

	values := make([]string, len(bars))
	width := labelW + plotW + 40
	for i, b := range bars {
		values[i] = thousands(b.Value) + "/s"
		if b.Note != "" {
			values[i] += " · " + b.Note
		}
		end := x0 + math.Max(1, b.Value*scale) + 6 + float64(len([]rune(values[i])))*charW + 16
		width = math.Max(width, end)
	}
	width = math.Max(width, float64(len([]rune(subtitle)))*charW+32)
	w := int(math.Ceil(width))
	height := top + len(bars)*(barH+gap) + axisH

	var s strings.Builder
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="%d">`+"\n",
		w, height, w, height, fontSize)
	fmt.Fprintf(&s, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", w, height)
	fmt.Fprintf(&s, `<text x="16" y="28" font-size="17" font-weight="bold" fill="#1a202c">%s</text>`+"\n", esc(title))
	fmt.Fprintf(&s, `<text x="16" y="50" fill="#4a5568">%s</text>`+"\n", esc(subtitle))

	plotBottom := top + len(bars)*(barH+gap) - gap/2
	for v := 0.0; v <= axisMax+step/2; v += step {
		x := x0 + v*scale
		fmt.Fprintf(&s, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e2e8f0"/>`+"\n", x, top-6, x, plotBottom)
		fmt.Fprintf(&s, `<text x="%.1f" y="%d" text-anchor="middle" fill="#4a5568">%s</text>`+"\n", x, plotBottom+18, thousands(v))
	}
	fmt.Fprintf(&s, `<text x="%.1f" y="%d" text-anchor="middle" fill="#4a5568">rows per second (higher is better)</text>`+"\n",
		x0+plotW/2, plotBottom+36)

	for i, b := range bars {
		y := top + i*(barH+gap)
		bw := math.Max(1, b.Value*scale)
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
