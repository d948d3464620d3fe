package messaging

import (
	"fmt"

	"github.com/bentoevents/bento/internal/clip"
)

// MaxRoutingKeyLen is the longest topic, binding pattern or exchange name
// the buses accept, in bytes: the AMQP short-string limit.
const MaxRoutingKeyLen = maxRoutingKeyLen

// The name rules below are the ones both buses apply: the memory bus and
// package rabbitmq check every name they are given with them, so that code
// tested on one bus is refused or accepted alike by the other.

// ValidateTopic checks a topic (routing key): 1 to MaxRoutingKeyLen bytes of
// words of ASCII letters, digits, '_' and '-' separated by single dots. It
// returns an error wrapping [ErrInvalidName] that names the topic.
func ValidateTopic(topic string) error { return validateTopic(topic) }

// ValidatePatterns checks binding patterns: at least one, each a topic whose
// words may also be '*' or '#'. It returns an error wrapping
// [ErrInvalidName] for each bad pattern.
func ValidatePatterns(patterns []string) error { return validatePatterns(patterns) }

// ValidateGroup checks a consumer group name, which is also its queue name:
// 1 to 200 ASCII letters, digits, '_', '.', ':' or '-', not starting with
// "amq.". It returns an error wrapping [ErrInvalidName].
func ValidateGroup(group string) error { return validateGroup(group) }

// ValidateExchange checks an exchange name by the same rule as a group
// name. It returns an error wrapping [ErrInvalidName].
func ValidateExchange(name string) error {
	if r := checkName(name); r != "" {
		return fmt.Errorf("%w: exchange %q %s", ErrInvalidName, clip.String(name), r)
	}
	return nil
}
