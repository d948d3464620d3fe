package promreg_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/promreg"
)

func TestRegisterSharesTheFirstCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "shared_total", Help: "h"}
	first, err := promreg.Register(reg, prometheus.NewCounter(opts))
	require.NoError(t, err)
	second, err := promreg.Register(reg, prometheus.NewCounter(opts))
	require.NoError(t, err)
	first.Inc()
	second.Inc()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, mfs, 1)
	assert.Equal(t, 2.0, mfs[0].GetMetric()[0].GetCounter().GetValue(), "both count into one series")

	_, err = promreg.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "shared_total", Help: "other"}))
	assert.Error(t, err, "a different collector under the same name")
	c := prometheus.NewCounter(opts)
	got, err := promreg.Register(nil, c)
	require.NoError(t, err)
	assert.Same(t, c, got)
}
