package inbox

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// counters returns the consumer's processed and duplicates counters,
// registered with reg (sharing vectors already registered there by other
// inboxes), or unregistered ones counting into nothing when reg is nil.
func counters(reg prometheus.Registerer, consumer string) (prometheus.Counter, prometheus.Counter, error) {
	processed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bento_inbox_processed_total", Help: "Messages applied (handler committed), by consumer.",
	}, []string{"consumer"})
	duplicates := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bento_inbox_duplicates_total", Help: "Deliveries skipped as already applied, by consumer.",
	}, []string{"consumer"})
	if reg != nil {
		var err error
		if processed, err = register(reg, processed); err != nil {
			return nil, nil, err
		}
		if duplicates, err = register(reg, duplicates); err != nil {
			return nil, nil, err
		}
	}
	return processed.WithLabelValues(consumer), duplicates.WithLabelValues(consumer), nil
}

func register(reg prometheus.Registerer, v *prometheus.CounterVec) (*prometheus.CounterVec, error) {
	err := reg.Register(v)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
			return existing, nil
		}
	}
	return v, err
}
