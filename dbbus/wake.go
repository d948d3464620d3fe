package dbbus

import (
	"slices"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
)

// waker wakes a bus's subscriptions: those of some queues, or all of them.
// A subscription waits on its queue's channel, which a wake of the queue
// or of every queue closes; the next wait gets a new channel. Waking by
// queue keeps a publish from making every subscription of the bus claim:
// with sixteen partition owners, a message for one partition would
// otherwise cost fifteen claims that find nothing.
type waker struct {
	mu sync.Mutex
	ch map[string]chan struct{} // by queue, while a subscription waits on it
}

// wakeup returns the channel the next wake of queue (or of every queue)
// closes.
func (w *waker) wakeup(queue string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = map[string]chan struct{}{}
	}
	c, ok := w.ch[queue]
	if !ok {
		c = make(chan struct{})
		w.ch[queue] = c
	}
	return c
}

// queues wakes the subscriptions of queues.
func (w *waker) queues(queues ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, q := range queues {
		if c, ok := w.ch[q]; ok {
			close(c)
			delete(w.ch, q)
		}
	}
}

// all wakes every subscription of the bus.
func (w *waker) all() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for q, c := range w.ch {
		close(c)
		delete(w.ch, q)
	}
}

// The payload of a notification on [NotifyChannel] is the publishing
// session's schema, alone (every subscription of the schema claims), or
// followed by a newline and the queues that got deliveries, separated by
// spaces (a queue name has neither). A list that would pass
// maxNotifyQueues bytes is left out: PostgreSQL refuses payloads of 8,000
// bytes or more.
const maxNotifyQueues = 7000

// notify has tx, on database d, notify [NotifyChannel] that queues got
// deliveries (nil: wake every subscription of the schema), for the
// operation op of its error; it does nothing on SQLite. PostgreSQL
// delivers the notification when tx commits, and folds identical ones of
// a transaction into one.
func notify(tx *gorm.DB, d dialect.Dialect, op string, queues []string) error {
	if d != dialect.Postgres {
		return nil
	}
	suffix := ""
	if list := strings.Join(queues, " "); list != "" && len(list) <= maxNotifyQueues {
		suffix = "\n" + list
	}
	if err := tx.Exec(`SELECT pg_notify(?, current_schema() || ?)`, NotifyChannel, suffix).Error; err != nil {
		return wrapDB(op+": notify", err)
	}
	return nil
}

// notifiedQueues returns the queues a notification's payload names, when
// it comes from schema: every queue the bus waits on when the payload is
// the schema alone.
func notifiedQueues(payload, schema string) (queues []string, ok bool) {
	if payload == schema {
		return nil, true
	}
	list, ok := strings.CutPrefix(payload, schema+"\n")
	if !ok {
		return nil, false
	}
	return strings.Split(list, " "), true
}

// wakeNotified wakes the subscriptions a notification names: queues, or
// every one when queues is nil.
func (b *Bus) wakeNotified(queues []string) {
	if queues == nil {
		b.wakes.all()
		return
	}
	b.wakes.queues(queues...)
}

// wakeLocal wakes the subscriptions of queues in this process after a
// publish, unless the bus listens: then the publishing transaction's
// notification wakes them once it commits, and a wake-up before that
// would only make them claim in vain.
func (b *Bus) wakeLocal(queues []string) {
	if b.listens {
		return
	}
	b.wakes.queues(queues...)
}

// queuesOf returns the distinct queues of routes that msgs go to, sorted.
func queuesOf(routes []route, msgs []*message.Message) []string {
	var qs []string
	for _, r := range routes {
		if r.partitions == 0 {
			qs = append(qs, r.group)
			continue
		}
		for _, m := range msgs {
			qs = append(qs, r.queue(m))
		}
	}
	slices.Sort(qs)
	return slices.Compact(qs)
}
