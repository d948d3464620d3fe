package consumer

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

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

// CancelAfter returns d, whose calls run cancel once they have taken n
// dead letters (before they handle the n-th), as an operator's Ctrl-C or
// a crash mid-way would.
func CancelAfter(d *DeadLetters, n int, cancel func()) *DeadLetters {
	return &DeadLetters{q: cancelAfter{q: d.q, n: n, cancel: cancel}}
}

type cancelAfter struct {
	q      deadQueue
	n      int
	cancel func()
}

func (c cancelAfter) browse(ctx context.Context, group string, verb deadVerb, pick func(*message.Message) (bool, bool)) (int, error) {
	taken := 0
	return c.q.browse(ctx, group, verb, func(msg *message.Message) (bool, bool) {
		take, stop := pick(msg)
		if take {
			if taken++; taken == c.n {
				c.cancel()
			}
		}
		return take, stop
	})
}
