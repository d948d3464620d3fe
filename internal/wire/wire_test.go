package wire_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/bentoevents/bento/internal/wire"
)

func TestNamingRules(t *testing.T) {
	long := strings.Repeat("a", wire.MaxTopicLen)
	for topic, ok := range map[string]bool{
		"order.paid": true, "a": true, "order_line-1.added": true, long: true,
		"": false, long + "b": false, "order..paid": false, ".order": false, "order.": false,
		"order.*": false, "order.#": false, "ordér.paid": false, "order paid": false,
	} {
		assert.Equal(t, ok, wire.Topic(topic) == "", "topic %q: %s", topic, wire.Topic(topic))
	}
	for pattern, ok := range map[string]bool{
		"order.*": true, "#": true, "*.paid": true, "order.#.late": true, "order.paid": true,
		"": false, "order.**": false, "order.#x": false, long + ".#": false,
	} {
		assert.Equal(t, ok, wire.Pattern(pattern) == "", "pattern %q: %s", pattern, wire.Pattern(pattern))
	}
	for name, ok := range map[string]bool{
		"billing": true, "bt.1a2b.notification.p3": true, "a:b-c_d": true, strings.Repeat("n", wire.MaxNameLen): true,
		"": false, strings.Repeat("n", wire.MaxNameLen+1): false, "amq.direct": false, "bad name": false, "bad/name": false,
	} {
		assert.Equal(t, ok, wire.Name(name) == "", "name %q: %s", name, wire.Name(name))
	}
}
