package console

import (
	"fmt"

	"github.com/bentoevents/bento/outbox"
)

// chart is the per-minute activity chart, drawn by the template as inline
// SVG: for each minute a published bar and a failed bar side by side.
type chart struct {
	Width, Height int
	// PlotLeft, PlotTop, PlotRight and PlotBottom bound the bars.
	PlotLeft, PlotTop, PlotRight, PlotBottom int
	// Max is the value at the top of the y axis.
	Max int64
	// Published and Failed are the totals over the chart.
	Published, Failed int64
	// From and To label the first and last minute.
	From, To string
	Slots    []slot
	Empty    bool
}

// slot is one minute: a hover area with its figures and the two bars.
type slot struct {
	X, W      int
	Title     string
	Published bar
	Failed    bar
}

// bar is one rectangle; H is 0 for a minute with nothing to show.
type bar struct {
	X, Y, W, H int
}

const (
	chartWidth  = 720
	chartHeight = 180
	plotLeft    = 44
	plotRight   = chartWidth - 8
	plotTop     = 10
	plotBottom  = chartHeight - 24
)

// newChart lays out minutes (oldest first) on the chart.
func newChart(minutes []outbox.Minute) *chart {
	ch := &chart{
		Width: chartWidth, Height: chartHeight,
		PlotLeft: plotLeft, PlotTop: plotTop, PlotRight: plotRight, PlotBottom: plotBottom,
	}
	var peak int64
	for _, m := range minutes {
		ch.Published += m.Published
		ch.Failed += m.Failed
		peak = max(peak, m.Published, m.Failed)
	}
	ch.Empty = peak == 0
	ch.Max = niceCeil(peak)
	if len(minutes) == 0 {
		return ch
	}
	ch.From = minutes[0].Start.UTC().Format("15:04")
	ch.To = minutes[len(minutes)-1].Start.UTC().Format("15:04") + " UTC"
	slotW := (plotRight - plotLeft) / len(minutes)
	barW := max((slotW-2)/2, 1)
	height := plotBottom - plotTop
	scale := func(n int64) int {
		if n <= 0 {
			return 0
		}
		return max(int(n*int64(height)/ch.Max), 1) // a non-zero count stays visible
	}
	for i, m := range minutes {
		x := plotLeft + i*slotW
		hp, hf := scale(m.Published), scale(m.Failed)
		ch.Slots = append(ch.Slots, slot{
			X: x, W: slotW,
			Title:     fmt.Sprintf("%s UTC: %d published, %d failed", m.Start.UTC().Format("15:04"), m.Published, m.Failed),
			Published: bar{X: x + 1, Y: plotBottom - hp, W: barW, H: hp},
			Failed:    bar{X: x + 1 + barW, Y: plotBottom - hf, W: barW, H: hf},
		})
	}
	return ch
}

// niceCeil rounds n up to 1, 2 or 5 times a power of ten (at least 1), so
// the y axis ends on a round number.
func niceCeil(n int64) int64 {
	if n <= 1 {
		return 1
	}
	for p := int64(1); ; p *= 10 {
		for _, f := range []int64{1, 2, 5} {
			if f*p >= n {
				return f * p
			}
		}
	}
}
