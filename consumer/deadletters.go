package consumer

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// CausePoison is the cause of a dead letter the broker sent to the group's
// dead-letter queue past the partition queue's delivery limit: it crashed
// or hung every consumer it reached. It carries no dead_cause header; its
// x-death header says delivery_limit.
const CausePoison = "poison"

// DeadLetter is a message in a consumer group's dead-letter queue.
type DeadLetter struct {
	MessageID        string
	EventType        string
	TenantID         string
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	// Cause is one of CauseDecode, CausePermanent, CauseFailed, CauseGap
	// and CausePoison; empty for a message that says nothing.
	Cause string
	// Error is the error that killed it.
	Error string
	// Attempts is how many attempts failed (0 when unknown).
	Attempts int
	// DeadAt is when it was given up (zero when unknown).
	DeadAt time.Time
	// Replays counts the times it was replayed before.
	Replays  int
	Metadata map[string]string
	Payload  []byte
}

// DeadFilter selects dead letters; its zero value selects all.
type DeadFilter struct {
	// IDs, when set, selects those message ids only.
	IDs []string
	// TenantID, when set, selects that tenant's dead letters only (the
	// messaging.MetaTenantID header, DeadLetter.TenantID).
	TenantID  string
	EventType string
	// AggregateType and AggregateID select an aggregate type, or one
	// aggregate when both are set.
	AggregateType, AggregateID string
	Cause                      string
	// OlderThan selects the dead letters given up that long ago or more.
	OlderThan time.Duration
}

func (f DeadFilter) match(d DeadLetter, now time.Time) bool {
	switch {
	case len(f.IDs) > 0 && !slices.Contains(f.IDs, d.MessageID),
		f.TenantID != "" && f.TenantID != d.TenantID,
		f.EventType != "" && f.EventType != d.EventType,
		f.AggregateType != "" && f.AggregateType != d.AggregateType,
		f.AggregateID != "" && f.AggregateID != d.AggregateID,
		f.Cause != "" && f.Cause != d.Cause,
		f.OlderThan > 0 && (d.DeadAt.IsZero() || now.Sub(d.DeadAt) < f.OlderThan):
		return false
	}
	return true
}

// deadLetterOf reads a dead letter from msg.
func deadLetterOf(msg *message.Message) DeadLetter {
	md := msg.Metadata
	d := DeadLetter{
		MessageID: msg.UUID, EventType: md.Get(messaging.MetaEventType), TenantID: md.Get(messaging.MetaTenantID),
		AggregateType: md.Get(messaging.MetaAggregateType), AggregateID: md.Get(messaging.MetaAggregateID),
		Cause: md.Get(MetaDeadCause), Error: md.Get(MetaDeadReason),
		Metadata: maps.Clone(map[string]string(md)), Payload: msg.Payload,
	}
	d.AggregateVersion, _ = strconv.ParseInt(md.Get(messaging.MetaAggregateVersion), 10, 64)
	d.Attempts, _ = strconv.Atoi(md.Get(MetaDeadAttempts))
	d.Replays, _ = strconv.Atoi(md.Get(MetaReplays))
	d.DeadAt, _ = time.Parse(time.RFC3339Nano, md.Get(MetaDeadAt))
	if d.Cause == "" {
		// The broker's own: past the delivery limit.
		var deaths []struct {
			Reason string    `json:"reason"`
			Count  int       `json:"count"`
			Time   time.Time `json:"time"`
		}
		if json.Unmarshal([]byte(md.Get("x-death")), &deaths) == nil && len(deaths) > 0 && deaths[0].Reason == "delivery_limit" {
			d.Cause, d.Attempts = CausePoison, deaths[0].Count
			d.Error = "delivered more often than the partition queue's delivery limit"
			if d.DeadAt.IsZero() {
				d.DeadAt = deaths[0].Time
			}
		}
	}
	return d
}

// DeadLetterQueue is the queue of group's dead letters: "<group>.dead".
func DeadLetterQueue(group string) string { return group + ".dead" }

// DeadLetterExchange is the exchange a consumer on RabbitMQ publishes the
// dead letters of its group to: "<exchange>.dead", for the group's events
// exchange.
func DeadLetterExchange(exchange string) string { return exchange + ".dead" }

// deadLimit bounds how many dead letters one call looks at.
const deadLimit = 100_000

// ListDeadLetters returns up to limit dead letters of group that f
// selects, on the RabbitMQ broker of cfg, oldest first, leaving them in
// the queue. It waits while another list, replay or discard of the group's
// dead letters runs, in this process or another (see rabbitmq.BrowseQueue),
// until ctx ends, so that none of them misses a dead letter the other
// holds.
//
// Errors: messaging.ErrQueueNotFound, ctx's error, or the broker's.
func ListDeadLetters(ctx context.Context, cfg *rabbitmq.Config, group string, f DeadFilter, limit int) ([]DeadLetter, error) {
	return collectDead(ctx, cfg, group, f, limit, nil)
}

// collectDead browses the dead letters of group and returns, oldest first,
// up to limit of those f selects. act, when not nil, is called on each of
// them and says what becomes of its message; one it fails for is not
// returned, and its error ends the browse.
func collectDead(ctx context.Context, cfg *rabbitmq.Config, group string, f DeadFilter, limit int,
	act func(d DeadLetter, msg *message.Message) (rabbitmq.Browse, error),
) ([]DeadLetter, error) {
	var out []DeadLetter
	now := time.Now()
	err := rabbitmq.BrowseQueue(ctx, cfg, DeadLetterQueue(group), deadLimit, func(msg *message.Message) (rabbitmq.Browse, error) {
		d := deadLetterOf(msg)
		if len(out) >= limit || !f.match(d, now) {
			return rabbitmq.Browse{}, nil
		}
		var b rabbitmq.Browse
		if act != nil {
			var err error
			if b, err = act(d, msg); err != nil {
				return b, err
			}
		}
		out = append(out, d)
		return b, nil
	})
	return out, err
}

// ReplayDeadLetters puts the dead letters of group that f selects back
// into the group's processing, and into no other group's, in their order:
// each is published again with its id and its headers, without the
// dead-letter headers and the broker's (x-death, x-delivery-count, ...)
// and with MetaReplays counted up, to the group's own route
// (rabbitmq.GroupRoute), then removed from the dead-letter queue once the
// broker confirmed it. A partitioned group receives it through its
// partitions' exchange, in the partition its partition key chooses (the
// one it came from, unless the partition count changed); a group without
// partitions receives it in its queue. Other groups bound to its event
// type never receive it. The inbox still skips one the group applied
// meanwhile. It returns the dead letters it replayed. It waits while
// another list, replay or discard of the group's dead letters runs, in
// this process or another (see rabbitmq.BrowseQueue), until ctx ends.
//
// Errors: messaging.ErrQueueNotFound (no dead-letter queue, or a group
// with neither partitions nor a queue), ctx's error, or the broker's.
func ReplayDeadLetters(ctx context.Context, cfg *rabbitmq.Config, group string, f DeadFilter) ([]DeadLetter, error) {
	route, err := rabbitmq.GroupRoute(ctx, cfg, group)
	if err != nil {
		return nil, err
	}
	return collectDead(ctx, cfg, group, f, deadLimit, func(d DeadLetter, msg *message.Message) (rabbitmq.Browse, error) {
		for k := range msg.Metadata {
			if deadHeader(k) {
				delete(msg.Metadata, k)
			}
		}
		msg.Metadata.Set(MetaReplays, strconv.Itoa(d.Replays+1))
		return rabbitmq.Browse{Republish: &route, Remove: true}, nil
	})
}

// deadHeader reports whether the header k says how a message died or was
// delivered: a dead-letter header of ours or of Watermill's, or one the
// broker adds when it dead-letters or redelivers a message.
func deadHeader(k string) bool {
	switch k {
	case MetaDeadCause, MetaDeadReason, MetaDeadAt, MetaDeadAttempts, middleware.PoisonedTopicKey,
		middleware.PoisonedHandlerKey, middleware.PoisonedSubscriberKey, "x-death", rabbitmq.HeaderDeliveryCount,
		messaging.MetaRedelivered:
		return true
	}
	return strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-")
}

// DiscardDeadLetters removes the dead letters of group that f selects and
// returns them. With the group's hold-back, release the aggregate of a
// discarded dead letter d (Consumer.Release, naming d.Aggregate() and
// d.MessageID) so its parked events go on. It waits while another list,
// replay or discard of the group's dead letters runs, in this process or
// another (see rabbitmq.BrowseQueue), until ctx ends.
//
// Errors: messaging.ErrQueueNotFound, ctx's error, or the broker's.
func DiscardDeadLetters(ctx context.Context, cfg *rabbitmq.Config, group string, f DeadFilter) ([]DeadLetter, error) {
	return collectDead(ctx, cfg, group, f, deadLimit, func(DeadLetter, *message.Message) (rabbitmq.Browse, error) {
		return rabbitmq.Browse{Remove: true}, nil
	})
}
