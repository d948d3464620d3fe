package main

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	t.Parallel()
	xs := []float64{5, 1, 3, 2, 4}
	for _, c := range []struct{ p, want float64 }{{0, 1}, {50, 3}, {100, 5}, {25, 2}, {90, 4.6}} {
		if got := percentile(xs, c.p); got != c.want {
			t.Errorf("percentile(%v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := median([]float64{1, 2, 3, 10}); got != 2.5 {
		t.Errorf("median of an even count = %v, want 2.5", got)
	}
	if got := median(nil); got != 0 {
		t.Errorf("median(nil) = %v, want 0", got)
	}
	if xs[0] != 5 {
		t.Error("percentile sorted its input in place")
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	s := summarize(ds)
	if s.Count != 100 || s.P50 != 50.5 || s.Max != 100 {
		t.Errorf("summarize = %+v", s)
	}
}

func TestParseLoadAvg(t *testing.T) {
	t.Parallel()
	got := parseLoadAvg("3.41 1.71 0.67 2/345 12345\n")
	if len(got) != 3 || got[0] != 3.41 || got[2] != 0.67 {
		t.Errorf("parseLoadAvg = %v, want [3.41 1.71 0.67]", got)
	}
	if got := parseLoadAvg("3.41 x"); got != nil {
		t.Errorf("parseLoadAvg of a short line = %v, want nil", got)
	}
	if s := loadText(nil); s != "unknown" {
		t.Errorf("loadText(nil) = %q", s)
	}
	if s := loadText([]float64{3.414, 1, 0.5}); s != "3.41 1.00 0.50" {
		t.Errorf("loadText = %q", s)
	}
}
