package dbbus

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestNotifiedQueues reads notification payloads: the schema alone wakes
// every subscription, the schema with a list wakes those queues, another
// schema's (even one whose name starts with this one's) wakes none.
func TestNotifiedQueues(t *testing.T) {
	for _, c := range []struct {
		payload string
		queues  []string
		ok      bool
	}{
		{"app", nil, true},
		{"app\nledger.p3", []string{"ledger.p3"}, true},
		{"app\nbilling ledger.p0 ledger.p7", []string{"billing", "ledger.p0", "ledger.p7"}, true},
		{"app2", nil, false},
		{"app2\nledger.p3", nil, false},
		{"other\nledger.p3", nil, false},
	} {
		queues, ok := notifiedQueues(c.payload, "app")
		assert.Equal(t, c.ok, ok, "%q", c.payload)
		assert.Equal(t, c.queues, queues, "%q", c.payload)
	}
}

// TestWakerWakesByQueue: a wake of a queue closes its waiters' channel
// alone; a wake of all closes every one; a later wait gets a new channel.
func TestWakerWakesByQueue(t *testing.T) {
	var w waker
	a, b := w.wakeup("a"), w.wakeup("b")
	assert.Equal(t, a, w.wakeup("a"), "waiters of one queue share a channel")
	w.queues("a", "c")
	assert.True(t, closed(a))
	assert.False(t, closed(b))
	a2 := w.wakeup("a")
	assert.False(t, closed(a2), "a wait after the wake-up waits for the next one")
	w.all()
	assert.True(t, closed(a2))
	assert.True(t, closed(b))
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
