package consumer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/rabbitmq"
)

// TestDefaultConfigTakesEachDocumentedChange: DefaultConfig with any one
// of the variants the docs describe (an unpartitioned group, classic
// queues, another batch size ...) is a valid configuration, and keeps that
// change once its defaults are filled in.
func TestDefaultConfigTakesEachDocumentedChange(t *testing.T) {
	t.Parallel()
	for name, change := range map[string]func(c *consumer.Config){
		"defaults":                     func(*consumer.Config) {},
		"unpartitioned":                func(c *consumer.Config) { c.Partitions = -1 },
		"unpartitioned, subscriptions": func(c *consumer.Config) { c.Partitions, c.Subscriptions = -1, 8 },
		"4 partitions":                 func(c *consumer.Config) { c.Partitions = 4 },
		"classic queues":               func(c *consumer.Config) { c.QueueType = rabbitmq.Classic },
		"delivery limit":               func(c *consumer.Config) { c.DeliveryLimit = 50 },
		"batch of 1":                   func(c *consumer.Config) { c.BatchSize = 1 },
		"no batches":                   func(c *consumer.Config) { c.BatchSize = -1 },
		"batch of 500":                 func(c *consumer.Config) { c.BatchSize = 500 },
		"batch wait":                   func(c *consumer.Config) { c.BatchWait = 2 * time.Millisecond },
		"partition concurrency":        func(c *consumer.Config) { c.PartitionConcurrency = 4 },
		"no retries":                   func(c *consumer.Config) { c.MaxRetries = -1 },
		"no crash count":               func(c *consumer.Config) { c.MaxCrashes = -1 },
		"no hold-back":                 func(c *consumer.Config) { c.DisableHoldBack = true },
		"handler timeout":              func(c *consumer.Config) { c.HandlerTimeout = time.Second },
		"takeover time":                func(c *consumer.Config) { c.TakeoverTime = 30 * time.Second },
		"contiguous versions":          func(c *consumer.Config) { c.Versions = inbox.VersionsContiguous },
	} {
		cfg := consumer.DefaultConfig("billing")
		change(cfg)
		assert.NoError(t, consumer.Validate(cfg), name)
	}

	got, err := consumer.Resolve(consumer.DefaultConfig("billing"))
	require.NoError(t, err)
	assert.Equal(t, consumer.DefaultBatchSize, got.BatchSize, "partitioned: batches")
	unpartitioned := consumer.DefaultConfig("billing")
	unpartitioned.Partitions = -1
	got, err = consumer.Resolve(unpartitioned)
	require.NoError(t, err)
	assert.Equal(t, 1, got.BatchSize, "unpartitioned: each message alone")
	assert.Equal(t, 1, got.Subscriptions)

	bad := consumer.DefaultConfig("billing")
	bad.Partitions, bad.BatchSize = -1, 10
	require.ErrorIs(t, consumer.Validate(bad), consumer.ErrInvalidConfig, "a batch size set without partitions is still refused")
}
