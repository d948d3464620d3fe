package projector

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bentoevents/bento/internal/promreg"
	"github.com/bentoevents/bento/outbox"
)

// metrics are the projector's Prometheus instruments; a nil *metrics
// records nothing.
type metrics struct {
	published *prometheus.CounterVec
	failed    *prometheus.CounterVec
	dead      *prometheus.CounterVec
	latency   prometheus.Histogram
	running   prometheus.Gauge
	// releaseLag observes how late each scheduled message was released.
	releaseLag prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, store *outbox.Store, tenantID string) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bento_outbox_published_total", Help: "Events the broker confirmed, by topic.",
		}, []string{"topic"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bento_outbox_failed_total", Help: "Failed publish attempts, by topic.",
		}, []string{"topic"}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bento_outbox_dead_total", Help: "Events that went dead after their last attempt, by topic.",
		}, []string{"topic"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "bento_outbox_publish_latency_seconds",
			Help:    "Time from an event's occurred_at to the broker's confirm.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "bento_projector_running", Help: "Projectors running (inside Run) in this process.",
		}),
		releaseLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "bento_outbox_scheduled_release_lag_seconds",
			Help:    "Time from a scheduled message's due time to its release into the outbox, by the database's clock.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
	}
	var err error
	if m.published, err = promreg.Register(reg, m.published); err != nil {
		return nil, err
	}
	if m.failed, err = promreg.Register(reg, m.failed); err != nil {
		return nil, err
	}
	if m.dead, err = promreg.Register(reg, m.dead); err != nil {
		return nil, err
	}
	if m.latency, err = promreg.Register(reg, m.latency); err != nil {
		return nil, err
	}
	if m.running, err = promreg.Register(reg, m.running); err != nil {
		return nil, err
	}
	if m.releaseLag, err = promreg.Register(reg, m.releaseLag); err != nil {
		return nil, err
	}
	if _, err = promreg.Register[prometheus.Collector](reg, &backlogCollector{store: store, tenant: tenantID}); err != nil {
		return nil, err
	}
	return m, nil
}

// runs counts a projector in Run until the returned function is called.
func (m *metrics) runs() (done func()) {
	if m == nil {
		return func() {}
	}
	m.running.Inc()
	return m.running.Dec
}

func (m *metrics) sent(topic string, occurredAt time.Time, now time.Time) {
	if m == nil {
		return
	}
	m.published.WithLabelValues(topic).Inc()
	m.latency.Observe(now.Sub(occurredAt).Seconds())
}

func (m *metrics) released(late []time.Duration) {
	if m == nil {
		return
	}
	for _, d := range late {
		m.releaseLag.Observe(max(d, 0).Seconds())
	}
}

func (m *metrics) failure(topic string, dead bool) {
	if m == nil {
		return
	}
	m.failed.WithLabelValues(topic).Inc()
	if dead {
		m.dead.WithLabelValues(topic).Inc()
	}
}

var (
	backlogDesc = prometheus.NewDesc("bento_outbox_backlog",
		"Outbox rows not yet sent by status: new, publishing, failed, dead (read at scrape time).", []string{"status"}, nil)
	oldestDesc = prometheus.NewDesc("bento_outbox_oldest_pending_age_seconds",
		"Age of the oldest row not yet relayed (new, publishing or failed).", nil, nil)
	scheduledDesc = prometheus.NewDesc("bento_outbox_scheduled_waiting",
		"Scheduled messages not yet released into the outbox (read at scrape time).", nil, nil)
	overdueDesc = prometheus.NewDesc("bento_outbox_scheduled_overdue_seconds",
		"How long past its due time the first scheduled message still waiting is; 0 when none is late.", nil, nil)
)

// backlogCollector reads the outbox's status counts when scraped.
type backlogCollector struct {
	store  *outbox.Store
	tenant string
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- backlogDesc
	ch <- oldestDesc
	ch <- scheduledDesc
	ch <- overdueDesc
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.store.Stats(ctx, &outbox.StatsOpts{Tenant: c.tenant})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(backlogDesc, err)
		return
	}
	for _, s := range outbox.UnsentStatuses {
		ch <- prometheus.MustNewConstMetric(backlogDesc, prometheus.GaugeValue, float64(st.Counts[s]), string(s))
	}
	ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, st.OldestPendingAge.Seconds())
	sb, err := c.store.ScheduledBacklog(ctx, c.tenant)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(scheduledDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(scheduledDesc, prometheus.GaugeValue, float64(sb.Waiting))
	ch <- prometheus.MustNewConstMetric(overdueDesc, prometheus.GaugeValue, sb.Overdue.Seconds())
}
