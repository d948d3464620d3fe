// Package promreg registers Prometheus collectors that several bento
// components of one process share.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg, or, when a collector with the same
// descriptors is registered already (another projector, consumer or
// publisher of the process registered it), returns that one, so that
// they count into the same series. With a nil reg it returns c
// unregistered, counting into nothing.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if reg == nil {
		return c, nil
	}
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}
