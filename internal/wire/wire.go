// Package wire owns bento's wire vocabulary, written once: the metadata
// keys every message carries and the naming rules for topics, binding
// patterns and queue, group and exchange names. Package messaging exports
// the keys (messaging.MetaEventType and so on) and the errors; outbox,
// inbox, messaging and internal/tracing check names and read keys here, so
// a rule cannot differ between the writer and the buses.
package wire

import (
	"fmt"
	"regexp"
	"strings"
)

// Metadata keys of the wire format.
const (
	EventType        = "event_type"
	AggregateType    = "aggregate_type"
	AggregateID      = "aggregate_id"
	AggregateVersion = "aggregate_version"
	TenantID         = "tenant_id"
	SchemaVersion    = "schema_version"
	OccurredAt       = "occurred_at"
	CorrelationID    = "correlation_id"
	CausationID      = "causation_id"
	Traceparent      = "traceparent"
	Tracestate       = "tracestate"
	PartitionKey     = "partition_key"
	Redelivered      = "bento_redelivered"
	Replays          = "bento_replays"
	Producer         = "producer"
	// DueAt is when a scheduled message fell due (RFC 3339, UTC): set
	// when the relay releases it, so a consumer can tell how late it came.
	DueAt = "due_at"
	// DeliveryCount is how many times the database bus delivered a
	// message to its queue before (a bus sets it on the way in).
	DeliveryCount = "bento_delivery_count"
)

// Metadata of dead letters, written by the consumer runtime and by the
// database bus past its delivery limit (package consumer exports them).
const (
	DeadCause    = "dead_cause"
	DeadReason   = "reason_poisoned" // Watermill's poison middleware's key
	DeadAt       = "dead_at"
	DeadAttempts = "dead_attempts"
	// CausePoison is the DeadCause of a message that crashed or hung every
	// consumer it reached.
	CausePoison = "poison"
)

// notTopicChars are the characters a topic cannot hold.
var notTopicChars = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// DeadLetterTopic is the topic the dead letters of group are published
// under: "bento-dead.<group>", with characters a topic cannot hold
// replaced by '_'.
func DeadLetterTopic(group string) string {
	return "bento-dead." + notTopicChars.ReplaceAllString(group, "_")
}

// MaxTopicLen is the longest topic (event type) and binding pattern, in
// bytes: the size of the outbox's topic column, well under AMQP's 255-byte
// routing keys.
const MaxTopicLen = 100

// MaxNameLen is the longest queue, group, consumer or exchange name.
const MaxNameLen = 200

var (
	wordRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	nameRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]+$`)
)

// Topic returns what is wrong with topic, an event type and routing key,
// or "": 1 to MaxTopicLen bytes of words of ASCII letters, digits, '_' and
// '-' separated by single dots ("order.paid").
func Topic(topic string) string { return words(topic, false) }

// Pattern returns what is wrong with a binding pattern, or "": a topic
// whose words may also be the wildcards '*' (one word) and '#' (any).
func Pattern(pattern string) string { return words(pattern, true) }

// Name returns what is wrong with a queue, consumer group, inbox consumer
// or exchange name, or "": 1 to MaxNameLen ASCII letters, digits, '_',
// '.', ':' or '-', not starting with "amq." (reserved by RabbitMQ).
func Name(name string) string {
	switch {
	case name == "":
		return "is empty"
	case len(name) > MaxNameLen || !nameRE.MatchString(name):
		return fmt.Sprintf("must be 1 to %d ASCII letters, digits, '_', '.', ':' or '-'", MaxNameLen)
	case strings.HasPrefix(name, "amq."):
		return `must not start with "amq." (reserved by the broker)`
	}
	return ""
}

func words(s string, wildcards bool) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > MaxTopicLen:
		return fmt.Sprintf("is longer than %d bytes", MaxTopicLen)
	}
	for _, w := range strings.Split(s, ".") {
		if wildcards && (w == "*" || w == "#") {
			continue
		}
		if !wordRE.MatchString(w) {
			if wildcards {
				return "must be dot-separated words of ASCII letters, digits, '_' or '-', or the wildcards '*' and '#'"
			}
			return "must be dot-separated words of ASCII letters, digits, '_' or '-'"
		}
	}
	return ""
}
