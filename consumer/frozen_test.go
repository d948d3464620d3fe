package consumer_test

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/rabbitmq"
)

// TestFrozenInstanceLosesItsPartitions: two worker processes (the default
// TakeoverTime, 10s) apply a backlog of 200 aggregates x 60 events with a
// handler that takes 10 ms per event; one of them is SIGSTOPped in the
// middle of its batches, holding their uncommitted transactions, their
// locks and its AMQP link. The other must apply events of the frozen one's
// partitions within TakeoverTime plus one AMQP heartbeat of the partition
// subscriptions, and go on to every aggregate the frozen one held. Then
// the frozen one is woken: every event must be applied exactly once, in
// order, and nothing dead-lettered.
func TestFrozenInstanceLosesItsPartitions(t *testing.T) {
	testenv.Stress(t)
	const aggregates, events = 200, 60
	b := newOrderedBed(t)
	// The default TakeoverTime: a shorter one gives the partition
	// subscriptions an AMQP heartbeat so short (1s at 3s) that a loaded
	// machine misses it.
	takeoverTime := consumer.DefaultTakeoverTime
	w := b.workers(t, b.dsn, envWorkerDelay+"=10ms", envWorkerTakeover+"="+takeoverTime.String())
	logOf := func(name string) []byte {
		out, err := os.ReadFile(filepath.Join(w.dir, name+".log"))
		require.NoError(t, err)
		return out
	}
	w.start("frozen")
	testenv.WaitFor(t, 30*time.Second, "the first worker owning every partition", func() bool {
		return bytes.Contains(logOf("frozen"), []byte("partitions assigned"))
	})
	w.start("peer")
	// Once the first worker has given the second its half, the partitions
	// stay where they are while both live.
	testenv.WaitFor(t, 30*time.Second, "the partitions dealt between the two", func() bool {
		return bytes.Contains(logOf("frozen"), []byte("partitions reassigned"))
	})
	pub, err := rabbitmq.NewConfirmPublisher(t.Context(), b.amqp)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	for v := int64(1); v <= events; v++ {
		round := make([]*message.Message, aggregates)
		for a := range round {
			round[a] = stepMsg(t, a, v)
		}
		require.NoError(t, pub.Publish(Step{}.EventType(), round...))
	}
	count := func(query string, args ...any) int64 {
		var n int64
		require.NoError(t, b.db.Raw(query, args...).Scan(&n).Error)
		return n
	}
	testenv.WaitFor(t, time.Minute, "both workers applying", func() bool {
		return count(`SELECT count(*) FROM applieds WHERE worker = 'frozen'`) > 300 &&
			count(`SELECT count(*) FROM applieds WHERE worker = 'peer'`) > 300
	})

	frozen := w.procs["frozen"].Process
	require.NoError(t, frozen.Signal(syscall.SIGSTOP))
	frozenAt := time.Now()
	woken := false
	wake := func() {
		if !woken {
			woken = true
			_ = frozen.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(wake) // before the worker's own cleanup kills it
	// The aggregates the frozen worker applied last are in its partitions:
	// the peer applying one of them has taken a partition over.
	last := count(`SELECT max(id) FROM applieds`)
	var held []string // with events left to apply
	require.NoError(t, b.db.Raw(`SELECT aggregate_id FROM (
  SELECT DISTINCT ON (aggregate_id) aggregate_id, worker FROM applieds ORDER BY aggregate_id, id DESC) l
WHERE worker = 'frozen' AND (SELECT count(*) FROM applieds a WHERE a.aggregate_id = l.aggregate_id) < ?`, events).
		Scan(&held).Error)
	require.NotEmpty(t, held)
	// takenOver returns how many of the held aggregates the peer has
	// applied events of.
	takenOver := func() int64 {
		return count(`SELECT count(DISTINCT aggregate_id) FROM applieds WHERE worker = 'peer' AND id > ? AND aggregate_id IN ?`,
			last, held)
	}
	t.Logf("froze the first worker after %d of %d events were applied; %d of its aggregates have events left",
		b.applied(t), aggregates*events, len(held))
	first := testenv.Poll(45*time.Second, func() bool { return takenOver() > 0 })
	firstAt := time.Since(frozenAt)
	all := first && testenv.Poll(30*time.Second, func() bool { return takenOver() == int64(len(held)) })
	allAt := time.Since(frozenAt)
	if !all {
		t.Fatalf("after %v the peer had applied events of %d of the %d aggregates the frozen worker held (TakeoverTime %v)",
			allAt.Round(time.Millisecond), takenOver(), len(held), takeoverTime)
	}
	t.Logf("the peer applied events of the frozen worker's partitions %v after the freeze, of all its aggregates %v after (TakeoverTime %v)",
		firstAt.Round(time.Millisecond), allAt.Round(time.Millisecond), takeoverTime)
	heartbeat := takeoverTime / 2 // the partition subscriptions' AMQP heartbeat
	assert.Less(t, firstAt, takeoverTime+heartbeat, "time to take the frozen worker's partitions over")

	testenv.WaitFor(t, 2*time.Minute, "the peer applying most of the backlog", func() bool {
		return b.applied(t) >= aggregates*events*3/4
	})
	wake()
	woke := count(`SELECT COALESCE(max(id), 0) FROM applieds`)
	testenv.WaitFor(t, 3*time.Minute, "every event applied", func() bool { return b.applied(t) >= aggregates*events })
	b.check(t, aggregates*events)
	// Its transactions ended with its PostgreSQL sessions (the idle
	// timeout) or its AMQP link, or were refused by the fence; what it
	// applied after waking came from its new subscriptions, in order.
	fenced := bytes.Count(logOf("frozen"), []byte("consumer: fenced"))
	after := count(`SELECT count(*) FROM applieds WHERE worker = 'frozen' AND id > ?`, woke)
	t.Logf("the woken worker: %d commits refused by the fence, %d events applied after waking, all in order", fenced, after)
}
