package redisbus_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/examples/redisbus"
	"github.com/bentoevents/bento/messaging/bustest"
)

// TestConformance runs bento's bus conformance suite on Redis Streams, each
// check with its own stream prefix.
func TestConformance(t *testing.T) {
	t.Parallel()
	addr := requireRedis(t)
	bustest.Run(t, func(t bustest.TB) *bustest.Bus {
		t.Helper()
		cfg := newConfig(t, addr)
		pub, err := redisbus.NewPublisher(cfg)
		if err != nil {
			t.Fatalf("NewPublisher: %v", err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		return &bustest.Bus{
			Publisher: pub,
			NewSubscriber: func(_ bustest.TB, group string, topics []string) (message.Subscriber, error) {
				return redisbus.NewSubscriber(cfg, group, topics)
			},
			// One consumer reads a stream in order.
			OrderedPerTopic: true,
			// An entry left pending by a closed subscriber is claimed once
			// idle for MaxIdleTime, at the next claim tick; the rest is
			// slack for a loaded machine.
			RedeliveryTimeout: redisbus.DefaultMaxIdleTime + redisbus.DefaultClaimInterval + 3*time.Second,
		}
	})
}
