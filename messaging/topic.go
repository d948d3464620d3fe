package messaging

import (
	"errors"
	"fmt"
	"strings"

	"github.com/bentoevents/bento/internal/clip"
	"github.com/bentoevents/bento/internal/wire"
)

// ErrInvalidName is returned for a topic, binding pattern, consumer group or
// exchange name that does not have the required form.
var ErrInvalidName = errors.New("messaging: invalid name")

// MaxRoutingKeyLen is AMQP's limit on routing keys and exchange names, in
// bytes (a short string): longer names a broker refuses.
const MaxRoutingKeyLen = 255

// MatchTopic reports whether topic matches the binding pattern with the
// semantics of an AMQP topic exchange: both are words separated by '.', a '*'
// word in the pattern matches exactly one word, a '#' word matches zero or
// more words, and any other word matches itself. The empty string has no
// words. For example "order.*" matches "order.paid" but not "order" nor
// "order.paid.late"; "order.#" matches all three; "#" matches every topic.
func MatchTopic(pattern, topic string) bool {
	p, t := words(pattern), words(topic)
	// next[j] reports whether p[i+1:] matches t[j:]; cur[j] whether p[i:]
	// does. Filled from the end of the pattern backwards.
	next := make([]bool, len(t)+1)
	cur := make([]bool, len(t)+1)
	next[len(t)] = true
	for i := len(p) - 1; i >= 0; i-- {
		switch w := p[i]; w {
		case "#":
			cur[len(t)] = next[len(t)]
			for j := len(t) - 1; j >= 0; j-- {
				cur[j] = next[j] || cur[j+1]
			}
		default:
			cur[len(t)] = false
			for j := len(t) - 1; j >= 0; j-- {
				cur[j] = (w == "*" || w == t[j]) && next[j+1]
			}
		}
		next, cur = cur, next
	}
	return next[0]
}

func words(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ".")
}

// The name rules below are bento's one set (internal to it: one topic rule
// for the outbox and both buses, see outbox.ValidateTopic): the memory bus
// and package rabbitmq check every name they are given with them, so that
// code tested on one bus is refused or accepted alike by the other.

// ValidateTopic checks a topic (routing key): 1 to 100 bytes
// (outbox.MaxTopicLen) of words of ASCII letters, digits, '_' and '-'
// separated by single dots. It returns an error wrapping [ErrInvalidName]
// that names the topic.
func ValidateTopic(topic string) error {
	if r := wire.Topic(topic); r != "" {
		return fmt.Errorf("%w: topic %q %s", ErrInvalidName, clip.String(topic), r)
	}
	return nil
}

// ValidatePatterns checks binding patterns: at least one, each a topic whose
// words may also be '*' or '#'. It returns an error wrapping
// [ErrInvalidName] for each bad pattern.
func ValidatePatterns(patterns []string) error {
	if len(patterns) == 0 {
		return fmt.Errorf("%w: no binding pattern given", ErrInvalidName)
	}
	var errs []error
	for _, p := range patterns {
		if r := wire.Pattern(p); r != "" {
			errs = append(errs, fmt.Errorf("%w: pattern %q %s", ErrInvalidName, clip.String(p), r))
		}
	}
	return errors.Join(errs...)
}

// ValidateGroup checks a consumer group name, which is also its queue name:
// 1 to 200 ASCII letters, digits, '_', '.', ':' or '-', not starting with
// "amq.". It returns an error wrapping [ErrInvalidName].
func ValidateGroup(group string) error {
	if r := wire.Name(group); r != "" {
		return fmt.Errorf("%w: group %q %s", ErrInvalidName, clip.String(group), r)
	}
	return nil
}

// ValidateExchange checks an exchange name by the same rule as a group
// name. It returns an error wrapping [ErrInvalidName].
func ValidateExchange(name string) error {
	if r := wire.Name(name); r != "" {
		return fmt.Errorf("%w: exchange %q %s", ErrInvalidName, clip.String(name), r)
	}
	return nil
}
