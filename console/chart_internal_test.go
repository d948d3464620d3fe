package console

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/bentoevents/bento/outbox"
)

func TestNiceCeil(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]int64{0: 1, 1: 1, 2: 2, 3: 5, 5: 5, 6: 10, 11: 20, 140: 200, 501: 1000, 1000: 1000} {
		assert.Equal(t, want, niceCeil(n), "niceCeil(%d)", n)
	}
}

func TestChartScalesBarsToTheBusiestMinute(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC)
	minutes := make([]outbox.Minute, ChartMinutes)
	for i := range minutes {
		minutes[i].Start = start.Add(time.Duration(i) * time.Minute)
	}
	minutes[0].Published = 50
	minutes[1].Published = 1
	minutes[59].Failed = 100
	ch := newChart(minutes)
	assert.Equal(t, int64(100), ch.Max)
	assert.Equal(t, int64(51), ch.Published)
	assert.Equal(t, int64(100), ch.Failed)
	assert.False(t, ch.Empty)
	assert.Equal(t, "09:00", ch.From)
	assert.Equal(t, "09:59 UTC", ch.To)
	assert.Len(t, ch.Slots, ChartMinutes)
	height := plotBottom - plotTop
	assert.Equal(t, height/2, ch.Slots[0].Published.H, "half the peak, half the height")
	assert.Equal(t, 1, ch.Slots[1].Published.H, "a small count stays visible")
	assert.Equal(t, height, ch.Slots[59].Failed.H)
	assert.Equal(t, plotTop, ch.Slots[59].Failed.Y)
	assert.Zero(t, ch.Slots[30].Published.H+ch.Slots[30].Failed.H)
	last := ch.Slots[59]
	assert.LessOrEqual(t, last.Failed.X+last.Failed.W, plotRight, "inside the plot")
	assert.Equal(t, "09:59 UTC: 0 published, 100 failed", last.Title)

	empty := newChart(minutes[:0])
	assert.True(t, empty.Empty)
	assert.Empty(t, empty.Slots)
}

func TestFmtAge(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0: "0s", -time.Second: "0s", 1400 * time.Millisecond: "1s", 12 * time.Second: "12s",
		3*time.Minute + 7*time.Second: "3m 07s", 4*time.Hour + 5*time.Minute: "4h 05m",
		51 * time.Hour: "2d 3h",
	} {
		assert.Equal(t, want, fmtAge(d), "fmtAge(%v)", d)
	}
}

func TestRelativePaths(t *testing.T) {
	t.Parallel()
	for p, want := range map[string]string{"/": "./", "/dead": "./", "/dead/": "../", "/dead/X": "../", "/dead/X/requeue": "../../"} {
		assert.Equal(t, want, relBase(p), "relBase(%q)", p)
	}
	r := httptest.NewRequest("GET", "/a/b/console/dead", nil)
	r.URL.Path = "/dead"
	assert.Equal(t, "/a/b/console", mountPrefix(r))
	r = httptest.NewRequest("GET", "/dead?x=1", nil)
	assert.Equal(t, "", mountPrefix(r))
}

func TestShortError(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "", shortError(nil))
	s := "first line\nsecond"
	assert.Equal(t, "first line …", shortError(&s))
	long := string(make([]rune, 300))
	assert.Len(t, []rune(shortError(&long)), shortErrorLen)
}
