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
)

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
