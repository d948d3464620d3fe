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
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/wire"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// CausePoison is the cause of a dead letter the broker sent to the group's
// dead-letter queue past the partition queue's delivery limit: it crashed
// or hung every consumer it reached. RabbitMQ's carries no dead_cause
// header; its x-death header says delivery_limit. The database bus's
// (dbbus.Config.DeliveryLimit) carries dead_cause "poison". The consumer
// gives the same cause to the messages it dead-letters after MaxCrashes
// or near the delivery limit.
const CausePoison = wire.CausePoison

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

// DeadLetters lists, replays and discards consumer groups' dead letters,
// in the queue DeadLetterQueue(group) of one bus: RabbitMQ
// ([RabbitMQDeadLetters]) or the database bus ([DatabaseDeadLetters]). The
// filters, the dead letters returned and what a replay sends are the same
// on both. It is safe for concurrent use, and concurrent calls on one
// group, in this process or others, neither miss a dead letter nor handle
// one twice. Get one from RabbitMQDeadLetters or DatabaseDeadLetters; the
// zero value is not usable.
type DeadLetters struct {
	q deadQueue
}

// RabbitMQDeadLetters returns the DeadLetters of the groups on the
// RabbitMQ broker of cfg, whose Exchange is the groups' event exchange. A
// call waits while another list, replay or discard of the group's dead
// letters runs, in this process or another (see rabbitmq.BrowseQueue),
// until its context ends.
func RabbitMQDeadLetters(cfg *rabbitmq.Config) *DeadLetters {
	return &DeadLetters{q: rabbitDead{cfg: cfg}}
}

// DatabaseDeadLetters returns the DeadLetters of the groups on the
// database bus (package dbbus) in db, where a group's dead-letter queue is
// the bus group DeadLetterQueue(group), bound to DeadLetterTopic(group).
// A replay or discard handles up to 100 dead letters per transaction and
// locks their rows, waiting for those another replay or discard holds
// (see dbbus.Browse); a list takes no lock. A replay moves each dead
// letter to the group in the transaction that takes it out of the
// dead-letter queue: it is never lost and never sent twice, and a replay
// whose context ends keeps what its committed transactions did and leaves
// the rest in the queue.
func DatabaseDeadLetters(db *gorm.DB) *DeadLetters {
	return &DeadLetters{q: databaseDead{db: db}}
}

// deadVerb is what a call does with the dead letters it selects.
type deadVerb int

const (
	deadList    deadVerb = iota // leave them
	deadReplay                  // send them back to the group
	deadDiscard                 // remove them
)

// deadQueue is the dead-letter queues of one bus.
type deadQueue interface {
	// browse calls pick on up to deadLimit dead letters of group, oldest
	// first, until pick says stop. Those pick takes it leaves (deadList),
	// removes (deadDiscard) or sends back to group alone with the
	// metadata pick left on them, removing them from the dead-letter
	// queue (deadReplay). It returns how many of those pick took it did
	// this with: the first n, also with an error.
	browse(ctx context.Context, group string, verb deadVerb, pick func(*message.Message) (take, stop bool)) (int, error)
}

// List returns up to limit dead letters of group that f selects, oldest
// first, leaving them in the queue.
//
// Errors: messaging.ErrQueueNotFound (no dead-letter queue),
// ErrInvalidConfig (DatabaseDeadLetters of a nil db), ctx's error, or the
// bus's.
func (d *DeadLetters) List(ctx context.Context, group string, f DeadFilter, limit int) ([]DeadLetter, error) {
	return d.collect(ctx, group, f, limit, deadList)
}

// Replay puts the dead letters of group that f selects back into the
// group's processing, and into no other group's, in their order: each is
// sent again with its id and its headers, without the dead-letter headers
// and the broker's (x-death, x-delivery-count, ...) and with MetaReplays
// counted up, to the group alone, and leaves the dead-letter queue. A
// partitioned group receives it in the partition its partition key
// chooses (the one it came from, unless the partition count changed); a
// group without partitions receives it in its queue. Other groups bound
// to its event type never receive it. The inbox still skips one the group
// applied meanwhile. It returns the dead letters it replayed, also with an
// error (those replayed before it).
//
// On RabbitMQ each is published to the group's route
// (rabbitmq.GroupRoute) and removed once the broker confirmed it; on the
// database bus each moves to the group in one transaction.
//
// Errors: messaging.ErrQueueNotFound (no dead-letter queue, or no group to
// replay to), ErrInvalidConfig, ctx's error, or the bus's.
func (d *DeadLetters) Replay(ctx context.Context, group string, f DeadFilter) ([]DeadLetter, error) {
	return d.collect(ctx, group, f, deadLimit, deadReplay)
}

// Discard removes the dead letters of group that f selects and returns
// them, also with an error (those removed before it). With the group's
// hold-back, release the aggregate of a discarded dead letter d
// (Consumer.Release, naming d.Aggregate() and d.MessageID) so its parked
// events go on.
//
// Errors: messaging.ErrQueueNotFound, ErrInvalidConfig, ctx's error, or
// the bus's.
func (d *DeadLetters) Discard(ctx context.Context, group string, f DeadFilter) ([]DeadLetter, error) {
	return d.collect(ctx, group, f, deadLimit, deadDiscard)
}

// collect browses the dead letters of group and does verb with up to
// limit of those f selects, oldest first; it returns those done.
func (d *DeadLetters) collect(ctx context.Context, group string, f DeadFilter, limit int, verb deadVerb) ([]DeadLetter, error) {
	var out []DeadLetter
	now := time.Now()
	n, err := d.q.browse(ctx, group, verb, func(msg *message.Message) (take, stop bool) {
		if len(out) >= limit {
			return false, true
		}
		dl := deadLetterOf(msg)
		if !f.match(dl, now) {
			return false, false
		}
		if verb == deadReplay {
			prepareReplay(msg, dl)
		}
		out = append(out, dl)
		return true, len(out) >= limit
	})
	return out[:n], err
}

// prepareReplay strips msg, the dead letter d, of the headers that say how
// it died or was delivered, and counts the replay.
func prepareReplay(msg *message.Message, d DeadLetter) {
	for k := range msg.Metadata {
		if deadHeader(k) {
			delete(msg.Metadata, k)
		}
	}
	msg.Metadata.Set(MetaReplays, strconv.Itoa(d.Replays+1))
}

// ListDeadLetters is RabbitMQDeadLetters(cfg).List: up to limit dead
// letters of group that f selects, on the RabbitMQ broker of cfg.
//
// Errors: as DeadLetters.List.
func ListDeadLetters(ctx context.Context, cfg *rabbitmq.Config, group string, f DeadFilter, limit int) ([]DeadLetter, error) {
	return RabbitMQDeadLetters(cfg).List(ctx, group, f, limit)
}

// ReplayDeadLetters is RabbitMQDeadLetters(cfg).Replay: it replays the
// dead letters of group that f selects, on the RabbitMQ broker of cfg.
//
// Errors: as DeadLetters.Replay.
func ReplayDeadLetters(ctx context.Context, cfg *rabbitmq.Config, group string, f DeadFilter) ([]DeadLetter, error) {
	return RabbitMQDeadLetters(cfg).Replay(ctx, group, f)
}

// DiscardDeadLetters is RabbitMQDeadLetters(cfg).Discard: it removes the
// dead letters of group that f selects, on the RabbitMQ broker of cfg.
//
// Errors: as DeadLetters.Discard.
func DiscardDeadLetters(ctx context.Context, cfg *rabbitmq.Config, group string, f DeadFilter) ([]DeadLetter, error) {
	return RabbitMQDeadLetters(cfg).Discard(ctx, group, f)
}

// deadHeader reports whether the header k says how a message died or was
// delivered: a dead-letter header of ours or of Watermill's, or one the
// broker adds when it dead-letters or redelivers a message.
func deadHeader(k string) bool {
	switch k {
	case MetaDeadCause, MetaDeadReason, MetaDeadAt, MetaDeadAttempts, middleware.PoisonedTopicKey,
		middleware.PoisonedHandlerKey, middleware.PoisonedSubscriberKey, "x-death", rabbitmq.HeaderDeliveryCount,
		messaging.MetaRedelivered, messaging.MetaDeliveryCount:
		return true
	}
	return strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-")
}
