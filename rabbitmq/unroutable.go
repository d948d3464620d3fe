package rabbitmq

import (
	"context"
	"slices"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/messaging"
)

// UnroutableQueue is the queue of the events published to exchange that no
// queue was bound for: "<exchange>.unroutable", behind the exchange's
// alternate exchange.
func UnroutableQueue(exchange string) string { return exchange + unroutableSuffix }

// UnroutableFilter selects events parked in the unroutable queue; its
// zero value selects all.
type UnroutableFilter struct {
	// EventTypes, when set, selects the events of those types only.
	EventTypes []string
	// TenantID, when set, selects that tenant's events only (the
	// messaging.MetaTenantID header).
	TenantID string
}

func (f UnroutableFilter) match(msg *message.Message) bool {
	return (len(f.EventTypes) == 0 || slices.Contains(f.EventTypes, msg.Metadata.Get(messaging.MetaEventType))) &&
		(f.TenantID == "" || f.TenantID == msg.Metadata.Get(messaging.MetaTenantID))
}

// ListUnroutable returns up to limit events parked in the unroutable queue
// of cfg's exchange that f selects, oldest first, leaving them there.
//
// Errors: messaging.ErrQueueNotFound, ErrInvalidConfig, or the broker's.
func ListUnroutable(ctx context.Context, cfg *Config, f UnroutableFilter, limit int) ([]*message.Message, error) {
	c, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	var out []*message.Message
	err = BrowseQueue(ctx, c, UnroutableQueue(c.Exchange), unroutableScan, func(msg *message.Message) (Browse, error) {
		if len(out) < limit && f.match(msg) {
			out = append(out, msg)
		}
		return Browse{}, nil
	})
	return out, err
}

// unroutableScan bounds how many messages one call looks at.
const unroutableScan = 100_000

// ReplayUnroutable publishes the parked events that f selects to cfg's
// exchange again, with their ids and headers, routed by their event type,
// and takes them out of the unroutable queue once the broker confirmed: declare the queue of the group that missed them first. An
// event still routed nowhere comes back to the unroutable queue; it is
// counted in back, not replayed again. It returns the events republished.
//
// Errors: messaging.ErrQueueNotFound, ErrInvalidConfig, or the broker's.
func ReplayUnroutable(ctx context.Context, cfg *Config, f UnroutableFilter) (replayed []*message.Message, back int, err error) {
	c, err := cfg.resolve()
	if err != nil {
		return nil, 0, err
	}
	seen := map[string]bool{}
	err = BrowseQueue(ctx, c, UnroutableQueue(c.Exchange), unroutableScan, func(msg *message.Message) (Browse, error) {
		if seen[msg.UUID] {
			back++
			return Browse{}, nil
		}
		et := msg.Metadata.Get(messaging.MetaEventType)
		if et == "" || !f.match(msg) {
			return Browse{}, nil
		}
		seen[msg.UUID] = true
		replayed = append(replayed, msg)
		return Browse{Republish: &Route{Exchange: c.Exchange, Key: et}, Remove: true}, nil
	})
	return replayed, back, err
}
