package inbox

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bentoevents/bento/internal/promreg"
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
	var err error
	if processed, err = promreg.Register(reg, processed); err != nil {
		return nil, nil, err
	}
	if duplicates, err = promreg.Register(reg, duplicates); err != nil {
		return nil, nil, err
	}
	return processed.WithLabelValues(consumer), duplicates.WithLabelValues(consumer), nil
}
