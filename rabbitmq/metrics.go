package rabbitmq

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bentoevents/bento/internal/promreg"
)

// publisherMetrics are ConfirmPublisher's Prometheus instruments; a nil
// *publisherMetrics records nothing.
type publisherMetrics struct {
	blocked prometheus.Gauge
}

func newPublisherMetrics(reg prometheus.Registerer) (*publisherMetrics, error) {
	if reg == nil {
		return nil, nil
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "bento_amqp_publisher_blocked",
		Help: "Publisher connections the broker blocks (connection.blocked: RabbitMQ is short of memory or disk): 1 while a publisher's connection is blocked.",
	})
	// Several publishers in one process share the gauge: each adds its
	// blocked connection to it.
	g, err := promreg.Register(reg, g)
	if err != nil {
		return nil, err
	}
	return &publisherMetrics{blocked: g}, nil
}

// block records that a connection was blocked (+1) or unblocked (-1).
func (m *publisherMetrics) block(delta float64) {
	if m == nil {
		return
	}
	m.blocked.Add(delta)
}
