package messaging_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/bentoevents/bento/messaging"
)

func TestMatchTopic(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern, topic string
		want           bool
	}{
		// exact
		{"order.paid", "order.paid", true},
		{"order.paid", "order.paid.late", false},
		{"order.paid", "order", false},
		{"order.paid", "order.paidx", false},
		{"order", "order", true},
		// '*' is exactly one word
		{"order.*", "order.paid", true},
		{"order.*", "order.paid.late", false},
		{"order.*", "order", false},
		{"order.*", "orders.paid", false},
		{"*.paid", "order.paid", true},
		{"*.paid", "paid", false},
		{"*.paid", "order.refund.paid", false},
		{"*", "order", true},
		{"*", "order.paid", false},
		{"*", "", false},
		{"*.*", "order.paid", true},
		{"order.*.late", "order.paid.late", true},
		{"order.*.late", "order.late", false},
		// '#' is zero or more words
		{"order.#", "order", true},
		{"order.#", "order.paid", true},
		{"order.#", "order.paid.late", true},
		{"order.#", "orders.paid", false},
		{"order.#", "payment.order", false},
		{"#", "order", true},
		{"#", "order.paid.late", true},
		{"#", "", true},
		{"#.paid", "paid", true},
		{"#.paid", "order.paid", true},
		{"#.paid", "order.refund.paid", true},
		{"#.paid", "order.paid.late", false},
		{"order.#.late", "order.late", true},
		{"order.#.late", "order.paid.late", true},
		{"order.#.late", "order.paid.very.late", true},
		{"order.#.late", "order.paid", false},
		{"#.#", "order", true},
		{"#.*", "", false},
		{"#.*", "order", true},
		{"*.#", "order.paid.late", true},
		{"#.order.#", "x.order.y", true},
		{"#.order.#", "order", true},
		{"#.order.#", "orders", false},
		{"#.a.#.b.#", "x.a.y.b.z", true},
		{"#.a.#.b.#", "x.b.y.a.z", false},
		// words are compared whole
		{"ord*.paid", "order.paid", false},
		{"", "", true},
		{"", "order", false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, messaging.MatchTopic(tt.pattern, tt.topic), "MatchTopic(%q, %q)", tt.pattern, tt.topic)
	}
}

func TestMatchTopicManyHashes(t *testing.T) {
	t.Parallel()
	// Linear in pattern x topic, not exponential in the number of '#'.
	pattern := "#.#.#.#.#.#.#.#.#.#.#.#.#.#.#.#.#.#.#.#.z"
	topic := "a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a"
	assert.False(t, messaging.MatchTopic(pattern, topic))
	assert.True(t, messaging.MatchTopic(pattern, topic+".z"))
}
