package messaging

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
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
	if err := reg.Register(g); err != nil {
		// Several publishers in one process share the gauge: each adds its
		// blocked connection to it.
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, err
		}
		existing, ok := are.ExistingCollector.(prometheus.Gauge)
		if !ok {
			return nil, err
		}
		g = existing
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
