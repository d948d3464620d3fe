package consumer

import "time"

// SetMetricsEvery sets how often running consumers refresh their gauges;
// call it before any consumer runs (TestMain).
func SetMetricsEvery(d time.Duration) { metricsEvery = d }

// Validate fills cfg's defaults and returns its problems, as New does.
func Validate(cfg *Config) error {
	_, err := cfg.withDefaults()
	return err
}

// Resolve returns cfg with its defaults filled in, as New does.
func Resolve(cfg *Config) (Config, error) { return cfg.withDefaults() }
