package consumer_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// supervise runs worker processes of w one after the other, starting a
// new one whenever the last exits, as a supervisor restarting a crashed
// service does, until the test ends. It returns how many times a worker
// exited.
func supervise(t *testing.T, w *workers) *atomic.Int32 {
	t.Helper()
	var exits atomic.Int32
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var cur *exec.Cmd
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), append(w.env, envWorker+"="+fmt.Sprintf("s%d", i))...)
			out, err := os.Create(filepath.Join(w.dir, fmt.Sprintf("s%d.log", i)))
			if err != nil {
				return
			}
			cmd.Stdout, cmd.Stderr = out, out
			mu.Lock()
			select {
			case <-stop:
				mu.Unlock()
				return
			default:
			}
			err = cmd.Start()
			cur = cmd
			mu.Unlock()
			if err != nil {
				return
			}
			_ = cmd.Wait()
			_ = out.Close()
			select {
			case <-stop:
				return
			default:
			}
			exits.Add(1)
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		close(stop)
		if cur != nil && cur.Process != nil {
			_ = cur.Process.Kill()
		}
		mu.Unlock()
		wg.Wait()
	})
	return &exits
}

// publishBacklog publishes aggregates x events Steps, version by version.
func publishBacklog(t *testing.T, b *orderedBed, aggregates, events int) {
	t.Helper()
	pub, err := rabbitmq.NewPublisher(t.Context(), b.amqp)
	require.NoError(t, err)
	defer pub.Close()
	for v := int64(1); v <= int64(events); v++ {
		for a := range aggregates {
			require.NoError(t, pub.Publish(Step{}.EventType(), stepMsg(t, a, v)))
		}
	}
}

// deadLetters returns the group's dead letters by message id.
func (b *orderedBed) deadLetters(t *testing.T) map[string]consumer.DeadLetter {
	t.Helper()
	dls, err := consumer.ListDeadLetters(t.Context(), b.amqp, b.group, consumer.DeadFilter{}, 10_000)
	if errors.Is(err, messaging.ErrQueueNotFound) {
		return nil // no worker has declared it yet
	}
	require.NoError(t, err)
	out := map[string]consumer.DeadLetter{}
	for _, d := range dls {
		out[d.MessageID] = d
	}
	return out
}

// settle waits up to within for want events to be applied, reports what
// it counted (events never applied, dead letters), then checks the run as
// check does.
func (b *orderedBed) settle(t *testing.T, want int, within time.Duration) {
	t.Helper()
	done := testenv.Poll(within, func() bool { return b.applied(t) >= int64(want) })
	applied := b.applied(t)
	t.Logf("%d of %d events applied, %d never; %d dead letters", applied, want, int64(want)-applied,
		deadDepth(t, b.ex.URL, b.group+".dead"))
	require.True(t, done, "every event applied within %v", within)
	b.check(t, want)
}

// versions returns the versions of agg applied, in the order applied.
func (b *orderedBed) versions(t *testing.T, agg string) []int64 {
	t.Helper()
	var vs []int64
	require.NoError(t, b.db.Raw(`SELECT version FROM applieds WHERE aggregate_id = ? ORDER BY id`, agg).Scan(&vs).Error)
	return vs
}

// TestCrashLoopDeadLettersOnlyThePoison: a backlog of 60 aggregates x 20
// events, and a handler that crashes its process (a panic in a goroutine
// it starts) on one event, a005 version 3, every time, under a supervisor
// that restarts the process each time it dies, with the default
// configuration (batches and prefetch of 100). Only that event may be
// dead-lettered, with the cause poison, holding its aggregate back: its
// later events are parked, never applied ahead of it, and every other
// event is applied once, in order. (Each crash gives back every message
// the process held, so the broker's delivery limit, counting give-backs,
// used to dead-letter the healthy ones too, without a hold.)
func TestCrashLoopDeadLettersOnlyThePoison(t *testing.T) {
	testenv.Stress(t)
	const aggregates, events = 60, 20
	const poison = "a005-003"
	b := newOrderedBed(t)
	publishBacklog(t, b, aggregates, events)
	exits := supervise(t, b.workers(t, b.dsn, envWorkerCrash+"="+poison))
	want := (aggregates-1)*events + 2
	settled := testenv.Poll(3*time.Minute, func() bool { return b.applied(t) >= int64(want) && len(b.deadLetters(t)) >= 1 })
	time.Sleep(2 * time.Second) // a late dead letter or a stray apply would show now
	dead := b.deadLetters(t)
	healthy := 0
	for id := range dead {
		if id != poison {
			healthy++
		}
	}
	applied := b.applied(t)
	t.Logf("%d crashes; %d dead letters, %d of them healthy; %d of %d healthy events applied, %d never",
		exits.Load(), len(dead), healthy, applied, want, int64(want)-applied)
	assert.True(t, settled, "every healthy event applied and the poison dead-lettered within 3 minutes")
	assert.Zero(t, healthy, "healthy messages dead-lettered")
	if assert.Contains(t, dead, poison) {
		assert.Equal(t, consumer.CausePoison, dead[poison].Cause)
	}
	assert.Equal(t, []int64{1, 2}, b.versions(t, "a005"), "the poisoned aggregate stops before its dead letter")
	var held []string
	require.NoError(t, b.db.Raw(`SELECT message_id FROM inbox_holds WHERE consumer = ? AND aggregate_id = 'a005'`, b.group).Scan(&held).Error)
	assert.Equal(t, []string{poison}, held, "the dead letter holds its aggregate")
	var parked int64
	require.NoError(t, b.db.Raw(`SELECT count(*) FROM inbox_parked WHERE consumer = ? AND aggregate_id = 'a005'`, b.group).Scan(&parked).Error)
	assert.EqualValues(t, events-3, parked, "the aggregate's later events parked behind it")
	var stats struct{ Total, Distinct, OutOfOrder int64 }
	require.NoError(t, b.db.Raw(`SELECT count(*) AS total, count(DISTINCT (aggregate_id, version)) AS distinct,
  count(*) FILTER (WHERE NOT in_order) AS out_of_order FROM applieds`).Scan(&stats).Error)
	t.Logf("%d events applied, %d of them twice, %d out of order", stats.Total, stats.Total-stats.Distinct, stats.OutOfOrder)
	assert.EqualValues(t, want, stats.Total, "applied")
	assert.EqualValues(t, want, stats.Distinct, "each event applied once")
	assert.Zero(t, stats.OutOfOrder, "events applied out of version order")
}

// TestBrokerLinkFlapsDeadLetterNothing: a worker applies a backlog of 32
// aggregates x 100 events (a 50 ms handler) through a TCP proxy to
// RabbitMQ that cuts every connection 30 times, 1 s apart. Each cut gives
// back every message the worker held; none of them failed, so nothing may
// be dead-lettered, and every event is applied once, in order.
func TestBrokerLinkFlapsDeadLetterNothing(t *testing.T) {
	testenv.Stress(t)
	const aggregates, events, cuts = 32, 100, 30
	b := newOrderedBed(t)
	publishBacklog(t, b, aggregates, events)
	via, proxy := testenv.Proxied(t, b.ex.URL)
	w := b.workers(t, b.dsn, envWorkerDelay+"=50ms")
	w.env = append(w.env, envWorkerAMQP+"="+via) // the later value wins
	w.start("w0")
	testenv.WaitFor(t, time.Minute, "the worker applying", func() bool { return b.applied(t) > 0 })
	for range cuts {
		time.Sleep(time.Second)
		proxy.Cut()
		time.Sleep(50 * time.Millisecond)
		proxy.Restore()
	}
	t.Logf("%d of %d events applied after %d link cuts", b.applied(t), aggregates*events, cuts)
	b.settle(t, aggregates*events, 4*time.Minute)
}

// TestPartitionMovesDeadLetterNothing: two workers apply a backlog of 32
// aggregates x 20 events (a 1 s handler) while the second one joins
// and leaves the group 25 times, each time moving half the partitions
// over and back. Each move gives back every message the partition's
// subscription held; none of them failed, so nothing may be
// dead-lettered, and every event is applied once, in order.
func TestPartitionMovesDeadLetterNothing(t *testing.T) {
	testenv.Stress(t)
	const aggregates, events, moves = 32, 20, 25
	b := newOrderedBed(t)
	publishBacklog(t, b, aggregates, events)
	w := b.workers(t, b.dsn, envWorkerDelay+"=1s")
	w.start("w0")
	testenv.WaitFor(t, time.Minute, "the first worker applying", func() bool { return b.applied(t) > 0 })
	members := func() (n int64) {
		b.db.Raw(`SELECT count(*) FROM consumer_members WHERE consumer = ?`, b.group).Scan(&n)
		return n
	}
	for i := range moves {
		name := fmt.Sprintf("j%d", i)
		w.start(name)
		testenv.WaitFor(t, 30*time.Second, "the second worker joined", func() bool { return members() == 2 })
		time.Sleep(time.Second) // it takes its partitions and applies
		require.NoError(t, w.procs[name].Process.Signal(syscall.SIGTERM))
		_ = w.procs[name].Wait()
		testenv.WaitFor(t, 30*time.Second, "the second worker left", func() bool { return members() == 1 })
	}
	t.Logf("%d of %d events applied after %d moves", b.applied(t), aggregates*events, moves)
	b.settle(t, aggregates*events, 4*time.Minute)
}

// TestBrokerBackstopHoldsItsAggregate: with crash counting off
// (MaxCrashes negative) and a delivery limit of 4, the crash loop of
// TestCrashLoopDeadLettersOnlyThePoison runs into the broker's limit,
// which spends a delivery of every message a dying process held. Whatever
// is dead-lettered then must hold its aggregate back like any dead
// letter: the consumer dead-letters a message at its last delivery below
// the limit itself, its aggregate held first, so the broker dead-letters
// nothing and no later version of a dead-lettered aggregate is ever
// applied ahead of it.
func TestBrokerBackstopHoldsItsAggregate(t *testing.T) {
	testenv.Stress(t)
	const aggregates, events, limit = 60, 20, 4
	const poison = "a005-003"
	b := newOrderedBed(t, func(c *consumer.Config) { c.DeliveryLimit = limit })
	publishBacklog(t, b, aggregates, events)
	exits := supervise(t, b.workers(t, b.dsn, envWorkerCrash+"="+poison, fmt.Sprintf("%s=%d,-1", envWorkerLimits, limit)))
	testenv.WaitFor(t, 3*time.Minute, "the poison dead-lettered", func() bool { return b.deadLetters(t)[poison].MessageID != "" })
	time.Sleep(3 * time.Second) // the worker goes on with what is left
	dead := b.deadLetters(t)
	var holds []struct{ AggregateID, MessageID string }
	require.NoError(t, b.db.Raw(`SELECT aggregate_id, message_id FROM inbox_holds WHERE consumer = ?`, b.group).Scan(&holds).Error)
	heldBy := map[string]string{}
	for _, h := range holds {
		heldBy[h.AggregateID] = h.MessageID
	}
	unheld, overtaken, byBroker := 0, 0, 0
	for id, d := range dead {
		if d.Metadata[consumer.MetaDeadCause] == "" {
			byBroker++
			t.Errorf("dead letter %s was dead-lettered by the broker, past its delivery limit", id)
		}
		if heldBy[d.AggregateID] == "" {
			unheld++
			t.Errorf("dead letter %s (cause %s) holds nothing", id, d.Cause)
		}
		for _, v := range b.versions(t, d.AggregateID) {
			if v > d.AggregateVersion {
				overtaken++
				t.Errorf("%s version %d applied after its dead letter %s", d.AggregateID, v, id)
				break
			}
		}
	}
	t.Logf("%d crashes; %d dead letters, %d by the broker, %d without a hold, %d overtaken by a later version",
		exits.Load(), len(dead), byBroker, unheld, overtaken)
	assert.Equal(t, consumer.CausePoison, dead[poison].Cause)
	// The poison is dead-lettered at its last delivery below the limit,
	// so its process died fewer times than the limit allows.
	assert.Less(t, int(exits.Load()), limit, "crashes")
}
