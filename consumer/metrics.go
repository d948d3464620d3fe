package consumer

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/promreg"
)

// metricsEvery is how often a running consumer refreshes the gauges it
// reads from the database and the broker: parked events and dead-letter
// depth. Tests shorten it before any consumer runs.
var metricsEvery = 10 * time.Second

// metrics are a consumer's own metrics, all labelled by group.
type metrics struct {
	batchSize    prometheus.Observer
	batchSeconds prometheus.Observer
	// handlerSeconds is by event_type and result ("ok" or "error").
	handlerSeconds prometheus.ObserverVec
	// deadLettered is by cause.
	deadLettered *prometheus.CounterVec
	partitions   prometheus.Gauge
	// partitionCount is the group's partition count (Config.Partitions).
	partitionCount prometheus.Gauge
	// parked is by reason.
	parked    *prometheus.GaugeVec
	deadDepth prometheus.Gauge
}

// newMetrics registers the consumer's metrics with reg (sharing those other
// consumers registered there), or returns unregistered ones when reg is
// nil.
func newMetrics(reg prometheus.Registerer, group string) (m metrics, err error) {
	g := prometheus.Labels{"group": group}
	size, err := promreg.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "bento_consumer_batch_size",
		Help:    "Messages per batch a partitioned consumer handled (one handled on its own counts as a batch of one), by group.",
		Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000},
	}, []string{"group"}))
	if err != nil {
		return m, err
	}
	seconds, err := promreg.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "bento_consumer_batch_duration_seconds",
		Help:    "Time to apply one batch of messages (one transaction), by group.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	}, []string{"group"}))
	if err != nil {
		return m, err
	}
	handler, err := promreg.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "bento_consumer_handler_duration_seconds",
		Help:    "Time a handler took for one message, by group, event type and result (ok, error).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"group", "event_type", "result"}))
	if err != nil {
		return m, err
	}
	dead, err := promreg.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bento_consumer_dead_lettered_total",
		Help: "Messages a consumer gave up on, by group and cause (decode, permanent, failed, gap); the broker's own dead letters past the delivery limit are in bento_consumer_dead_letters.",
	}, []string{"group", "cause"}))
	if err != nil {
		return m, err
	}
	parts, err := promreg.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "bento_consumer_partitions_owned",
		Help: "Partitions this instance handles now, by group.",
	}, []string{"group"}))
	if err != nil {
		return m, err
	}
	count, err := promreg.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "bento_consumer_partitions",
		Help: "The group's partition count (0: unpartitioned), by group.",
	}, []string{"group"}))
	if err != nil {
		return m, err
	}
	parked, err := promreg.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "bento_consumer_parked",
		Help: "Events parked behind a dead letter (held), waiting for a predecessor (waiting) or given up after the gap timeout (gap), by group and reason.",
	}, []string{"group", "reason"}))
	if err != nil {
		return m, err
	}
	depth, err := promreg.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "bento_consumer_dead_letters",
		Help: "Messages waiting in the group's dead-letter queue, by group.",
	}, []string{"group"}))
	if err != nil {
		return m, err
	}
	handlerVec, err := handler.CurryWith(g)
	if err != nil {
		return m, err
	}
	deadVec, err := dead.CurryWith(g)
	if err != nil {
		return m, err
	}
	parkedVec, err := parked.CurryWith(g)
	if err != nil {
		return m, err
	}
	// Every cause exists from the start, at 0, so alerts see the series.
	for _, cause := range []string{CauseDecode, CausePermanent, CauseFailed, CauseGap} {
		deadVec.WithLabelValues(cause)
	}
	return metrics{
		batchSize: size.With(g), batchSeconds: seconds.With(g), handlerSeconds: handlerVec, deadLettered: deadVec,
		partitions: parts.With(g), partitionCount: count.With(g), parked: parkedVec, deadDepth: depth.With(g),
	}, nil
}

// observe records a batch of n messages applied since start.
func (m metrics) observe(n int, start time.Time) {
	m.batchSize.Observe(float64(n))
	m.batchSeconds.Observe(time.Since(start).Seconds())
}

// countingPublisher counts the dead letters it publishes by cause.
type countingPublisher struct {
	message.Publisher
	dead *prometheus.CounterVec
}

func (p countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	for _, m := range msgs {
		cause := m.Metadata.Get(MetaDeadCause)
		if cause == "" {
			cause = "unknown"
		}
		p.dead.WithLabelValues(cause).Inc()
	}
	return nil
}

// refreshGauges sets the gauges read from the database and the broker,
// every metricsEvery until ctx ends.
func (c *Consumer) refreshGauges(ctx context.Context) {
	tick := time.NewTicker(metricsEvery)
	defer tick.Stop()
	for {
		if !c.cfg.DisableHoldBack && c.cfg.Partitions > 0 {
			counts, err := c.inbox.ParkedCounts(ctx)
			if err == nil {
				for _, reason := range []string{inbox.ParkedHeld, inbox.ParkedWaiting, inbox.ParkedGap} {
					c.metrics.parked.WithLabelValues(reason).Set(float64(counts[reason]))
				}
			}
		}
		if c.deadDepth != nil {
			dctx, cancel := context.WithTimeout(ctx, metricsEvery/2)
			if n, err := c.deadDepth(dctx); err == nil {
				c.metrics.deadDepth.Set(float64(n))
			}
			cancel()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
