package consumer_test

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
)

// metric returns the value of the series of name whose labels include
// labels (a counter or gauge value, a histogram's sample count), and
// whether there is one.
func (s *suite) metric(t *testing.T, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := s.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			return value(m), true
		}
	}
	return 0, false
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}

// TestConsumerMetrics: a partitioned group whose handler fails for good on
// one event reports its handler durations by result, the dead letter by
// cause, the partitions it owns, the event parked behind the dead letter
// and the depth of its dead-letter queue.
func TestConsumerMetrics(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newHoldSuite(t, h, nil, 2)
		for v := int64(1); v <= 3; v++ {
			s.publish(t, Step{}.EventType(), stepMsg(t, 0, v))
		}
		s.waitParked(t, map[string]string{"a000-003": inbox.ParkedHeld})
		group := map[string]string{"group": s.group}
		with := func(k, v string) map[string]string { return map[string]string{"group": s.group, k: v} }
		testenv.WaitFor(t, 10*time.Second, "the gauges refreshed", func() bool {
			parked, _ := s.metric(t, "bento_consumer_parked", with("reason", inbox.ParkedHeld))
			depth, _ := s.metric(t, "bento_consumer_dead_letters", group)
			return parked == 1 && depth == 1
		})
		ok, _ := s.metric(t, "bento_consumer_handler_duration_seconds", map[string]string{"group": s.group, "event_type": Step{}.EventType(), "result": "ok"})
		failed, _ := s.metric(t, "bento_consumer_handler_duration_seconds", with("result", "error"))
		assert.GreaterOrEqual(t, ok, 1.0, "handler calls that succeeded")
		assert.GreaterOrEqual(t, failed, 1.0, "handler calls that failed")
		dead, _ := s.metric(t, "bento_consumer_dead_lettered_total", with("cause", consumer.CausePermanent))
		assert.Equal(t, 1.0, dead)
		owned, _ := s.metric(t, "bento_consumer_partitions_owned", group)
		assert.Equal(t, 4.0, owned, "all 4 partitions: the only instance")
		waiting, found := s.metric(t, "bento_consumer_parked", with("reason", inbox.ParkedWaiting))
		assert.True(t, found)
		assert.Zero(t, waiting)
	})
}
