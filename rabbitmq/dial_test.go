package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/rabbitmq"
)

// TestConstructorsReturnWhenTheirContextEnds builds each publisher and
// subscriber through a link that accepts the connection and then says
// nothing (amqp091 would wait 30 s for the handshake): each constructor
// must give up with its context's error once the context ends.
func TestConstructorsReturnWhenTheirContextEnds(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	via, proxy := viaProxy(t, r.cfg)
	proxy.Stall()
	constructors := map[string]func(ctx context.Context) error{
		"NewPublisher": func(ctx context.Context) error {
			_, err := rabbitmq.NewPublisher(ctx, via)
			return err
		},
		"NewConfirmPublisher": func(ctx context.Context) error {
			_, err := rabbitmq.NewConfirmPublisher(ctx, via)
			return err
		},
		"NewSubscriber": func(ctx context.Context) error {
			_, err := rabbitmq.NewSubscriber(ctx, via, r.group("silent"), "order.*")
			return err
		},
	}
	for name, build := range constructors {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := build(ctx)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.Less(t, time.Since(start), 5*time.Second, "the constructor outlived its context")
		})
	}
}
