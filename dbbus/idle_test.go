package dbbus_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// statementCounter counts the statements run through a GORM session that
// match.
type statementCounter struct {
	logger.Interface
	match func(sql string) bool
	mu    sync.Mutex
	n     int
}

func (c *statementCounter) LogMode(logger.LogLevel) logger.Interface { return c }

func (c *statementCounter) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	if sql, _ := fc(); c.match(sql) {
		c.mu.Lock()
		c.n++
		c.mu.Unlock()
	}
}

func (c *statementCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// TestIdleSubscriptionsPollByDefault leaves a plain subscription and a
// partition's owner idle for six seconds on each database with the
// default configuration. An idle subscription's polls are most of its
// cost, so on PostgreSQL, where the bus listens and any process's publish
// wakes it, the plain subscription polls every 5 s and the owner not at
// all (it looks at its renewals, every 10 s); on SQLite, where polling is
// how other processes' messages are found, both every 200 ms. Then
// another bus publishes on PostgreSQL: the listening subscriptions
// receive it at once.
func TestIdleSubscriptionsPollByDefault(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		counter := &queueClaims{Interface: logger.Discard, n: map[string]int{}}
		counted := db.Session(&gorm.Session{Logger: counter})
		bus := setup(t, counted, dbbus.Config{})
		require.NoError(t, dbbus.DeclareGroup(t.Context(), db, "billing", "order.*"))
		require.NoError(t, dbbus.DeclarePartitions(t.Context(), db, "ledger", 1, "order.*"))
		_, plain := subscribe(t, bus, "billing")
		owned, err := bus.PartitionSubscriber(1).Subscribe(t.Context(), messaging.PartitionQueue("ledger", 0))
		require.NoError(t, err)

		time.Sleep(500 * time.Millisecond) // the first claims
		counter.take()
		const idle = 6 * time.Second
		time.Sleep(idle)
		claims := counter.take()
		t.Logf("%s: claims by two idle subscriptions in %v: %v", b.Name, idle, claims)
		owner := messaging.PartitionQueue("ledger", 0)
		if b.Name != "postgres" {
			assert.GreaterOrEqual(t, claims["billing"], 20, "polls every 200 ms without notifications")
			assert.GreaterOrEqual(t, claims[owner], 20, "polls every 200 ms without notifications")
			return
		}
		assert.LessOrEqual(t, claims["billing"], 2, "polls every 5 s where the bus listens")
		assert.Zero(t, claims[owner], "an owner that listens does not poll")

		other := setup(t, db, dbbus.Config{NoListen: true})
		m := newMessage(`{}`)
		require.NoError(t, other.Publish("order.paid", m))
		for _, ch := range []<-chan *message.Message{plain, owned} {
			got := receive(t, ch, time.Second)
			assert.Equal(t, m.UUID, got.UUID, "woken by the notification, not the poll")
			got.Ack()
		}
	})
}

// TestBatchSubscriberSharesOut publishes two messages at once to a group.
// Claims of a batch (16) let the subscription that claims first take both:
// a second subscription gets none until the first settles them. Claims of
// one share them out between two subscriptions, one each, at once. (With
// batches, the second subscription subscribes once the first holds the
// messages: two claims that start together, as a publish's wake-up starts
// them, may each lock one of the rows, SKIP LOCKED passing over the
// other's.)
func TestBatchSubscriberSharesOut(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		for _, batch := range []int{16, 1} {
			bus := setup(t, db, dbbus.Config{})
			group := fmt.Sprintf("billing%d", batch)
			require.NoError(t, dbbus.DeclareGroup(t.Context(), db, group, "order.*"))
			subscribe := func() <-chan *message.Message {
				sub := bus.BatchSubscriber(batch)
				t.Cleanup(func() { _ = sub.Close() })
				ch, err := sub.Subscribe(t.Context(), group)
				require.NoError(t, err)
				return ch
			}
			chans := []<-chan *message.Message{subscribe()}
			if batch == 1 {
				chans = append(chans, subscribe())
			}
			time.Sleep(100 * time.Millisecond)                          // the first, empty claims
			require.NoError(t, db.Transaction(func(tx *gorm.DB) error { // both visible at once
				return bus.PublishTx(tx, "order.paid", newMessage(`{"n":1}`), newMessage(`{"n":2}`))
			}))
			if batch != 1 {
				m := receive(t, chans[0], 10*time.Second)
				defer m.Ack()
				second := subscribe()
				select {
				case m := <-second:
					t.Errorf("claims of %d: the first claim took both, yet a second subscription received %s", batch, m.UUID)
				case <-time.After(time.Second):
				}
				continue
			}
			received := 0
			for _, ch := range chans {
				select {
				case m := <-ch:
					received++
					defer m.Ack()
				case <-time.After(2 * time.Second):
				}
			}
			assert.Equal(t, 2, received, "claims of one: a message each, held at once")
		}
	})
}

// queueClaims counts the claim statements run through a GORM session, by
// queue.
type queueClaims struct {
	logger.Interface
	mu sync.Mutex
	n  map[string]int
}

func (c *queueClaims) LogMode(logger.LogLevel) logger.Interface { return c }

var claimedQueue = regexp.MustCompile(`group_name = ["']([^"']+)["'] AND lease_token IS NULL`)

func (c *queueClaims) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	sql, _ := fc()
	if !strings.Contains(sql, "SET lease_token") {
		return
	}
	if m := claimedQueue.FindStringSubmatch(sql); m != nil {
		c.mu.Lock()
		c.n[m[1]]++
		c.mu.Unlock()
	}
}

func (c *queueClaims) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

// ownPartitions declares group with parts partitions bound to "order.*"
// and subscribes one owner (prefetch 1) of bus to each of its queues,
// returning their channels by partition.
func ownPartitions(t *testing.T, db *gorm.DB, bus *dbbus.Bus, group string, parts int) []<-chan *message.Message {
	t.Helper()
	require.NoError(t, dbbus.DeclarePartitions(t.Context(), db, group, parts, "order.*"))
	chans := make([]<-chan *message.Message, parts)
	for p := range parts {
		ch, err := bus.PartitionSubscriber(1).Subscribe(t.Context(), messaging.PartitionQueue(group, p))
		require.NoError(t, err)
		chans[p] = ch
	}
	return chans
}

// publishers returns bus and, on PostgreSQL, a bus of its own that does
// not listen: what it publishes reaches bus's subscriptions through
// notifications only, as another process's publishes do.
func publishers(t *testing.T, b testenv.Backend, db *gorm.DB, bus *dbbus.Bus) []*dbbus.Bus {
	t.Helper()
	if b.Name != "postgres" {
		return []*dbbus.Bus{bus}
	}
	return []*dbbus.Bus{bus, setup(t, db, dbbus.Config{NoListen: true})}
}

// keyOf returns a partition key that goes to partition p of n.
func keyOf(t *testing.T, p, n int) string {
	t.Helper()
	for i := range 10000 {
		if k := fmt.Sprintf("account-%d", i); messaging.PartitionOf(k, n) == p {
			return k
		}
	}
	t.Fatalf("no key of partition %d of %d", p, n)
	return ""
}

// TestPublishWakesOnlyItsQueues has an owner on each of eight partitions
// of a group (polls an hour apart, so only wake-ups make them claim), and
// publishes 20 messages, one at a time, all of one partition: through the
// bus itself, and on PostgreSQL through another bus whose notifications
// wake this one. The partition's owner receives each; the seven others
// must not claim: a wake-up per publish to every subscription of the bus
// would make each of them claim, in vain, 20 times (160 statements).
func TestPublishWakesOnlyItsQueues(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		const parts, hot = 8, 3
		counter := &queueClaims{Interface: logger.Discard, n: map[string]int{}}
		bus := setup(t, db.Session(&gorm.Session{Logger: counter}), dbbus.Config{PollInterval: time.Hour})
		chans := ownPartitions(t, db, bus, "ledger", parts)
		time.Sleep(500 * time.Millisecond) // the first claims
		counter.take()

		pubs := publishers(t, b, db, bus)
		key := keyOf(t, hot, parts)
		for _, pub := range pubs {
			for range 10 {
				m := newMessage(`{}`)
				m.Metadata.Set(messaging.MetaPartitionKey, key)
				require.NoError(t, pub.Publish("order.paid", m))
				got := receive(t, chans[hot], 5*time.Second)
				require.Equal(t, m.UUID, got.UUID)
				got.Ack()
			}
		}
		time.Sleep(200 * time.Millisecond) // the last acks' claims
		claims := counter.take()
		hotQueue := messaging.PartitionQueue("ledger", hot)
		others := 0
		for q, n := range claims {
			if q != hotQueue {
				others += n
			}
		}
		t.Logf("%s: claims by queue %v", b.Name, claims)
		assert.GreaterOrEqual(t, claims[hotQueue], 10*len(pubs), "the hot partition's owner claims each message")
		assert.LessOrEqual(t, others, 2, "the other partitions' owners stay asleep")
	})
}

// TestPublishToManyQueuesWakesAll publishes one message to each of 64
// partitions of a group whose queue names are 160 bytes long, in one
// call: the list of queues (over 10,000 bytes) does not fit a
// notification, which PostgreSQL refuses from 8,000 bytes, so the publish
// must notify the schema alone, waking every subscription, and each owner
// receives its message from another bus.
func TestPublishToManyQueuesWakesAll(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	bus := setup(t, db, dbbus.Config{PollInterval: time.Hour})
	const parts = 64
	group := strings.Repeat("g", 150)
	chans := ownPartitions(t, db, bus, group, parts)
	time.Sleep(500 * time.Millisecond) // the first claims
	msgs := make([]*message.Message, parts)
	for p := range parts {
		msgs[p] = newMessage(`{}`)
		msgs[p].Metadata.Set(messaging.MetaPartitionKey, keyOf(t, p, parts))
	}
	other := setup(t, db, dbbus.Config{NoListen: true})
	require.NoError(t, other.Publish("order.paid", msgs...))
	for p := range parts {
		got := receive(t, chans[p], 5*time.Second)
		assert.Equal(t, msgs[p].UUID, got.UUID, "partition %d", p)
		got.Ack()
	}
}

// TestUnroutableWakesItsSubscriber publishes on a topic no group is bound
// to, with polls an hour apart: the subscriber of dbbus.UnroutableGroup
// is woken, by the publishing bus itself and, on PostgreSQL, by another
// bus's notification, as a group's subscriber is.
func TestUnroutableWakesItsSubscriber(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{PollInterval: time.Hour})
		_, ch := subscribe(t, bus, dbbus.UnroutableGroup)
		time.Sleep(200 * time.Millisecond) // the first claim
		for _, pub := range publishers(t, b, db, bus) {
			m := newMessage(`{}`)
			require.NoError(t, pub.Publish("nobody.listens", m))
			got := receive(t, ch, 5*time.Second)
			assert.Equal(t, m.UUID, got.UUID)
			got.Ack()
		}
	})
}
