package consumer

import "time"

// SetMetricsEvery sets how often running consumers refresh their gauges;
// call it before any consumer runs (TestMain).
func SetMetricsEvery(d time.Duration) { metricsEvery = d }
