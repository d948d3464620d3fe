package projector_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
)

// hopGroup is the consumer group the database-bus tests bind to every
// counter event.
const hopGroup = "ledger"

// newDBBus migrates the database bus into db, declares hopGroup and
// returns a bus on db, closed at cleanup.
func newDBBus(t *testing.T, db *gorm.DB) *dbbus.Bus {
	t.Helper()
	require.NoError(t, dbbus.Migrate(t.Context(), db))
	require.NoError(t, dbbus.DeclareGroup(t.Context(), db, hopGroup, "counter.*"))
	bus, err := dbbus.New(db, &dbbus.Config{PollInterval: 20 * time.Millisecond, Logger: fastConfig().Logger})
	require.NoError(t, err)
	t.Cleanup(func() { _ = bus.Close() })
	return bus
}

// receipts counts the messages a subscription of hopGroup received, by
// UUID (the outbox row's id); it acks each one, so the bus forgets a
// message once it was handled.
type receipts struct {
	mu sync.Mutex
	n  map[string]int
	tp map[string]string // the traceparent each message came with
}

// consume subscribes to hopGroup on bus until the test ends.
func consume(t *testing.T, bus *dbbus.Bus) *receipts {
	t.Helper()
	r := &receipts{n: map[string]int{}, tp: map[string]string{}}
	sub := bus.Subscriber()
	ch, err := sub.Subscribe(t.Context(), hopGroup)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			r.mu.Lock()
			r.n[m.UUID]++
			r.tp[m.UUID] = m.Metadata.Get(messaging.MetaTraceparent)
			r.mu.Unlock()
			m.Ack()
		}
	}()
	t.Cleanup(func() {
		_ = sub.Close()
		<-done
	})
	return r
}

func (r *receipts) traceparent(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tp[id]
}

func (r *receipts) counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.n))
	for k, v := range r.n {
		out[k] = v
	}
	return out
}

// busRows counts the rows of a dbbus table.
func busRows(t *testing.T, db *gorm.DB, table string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Table(table).Count(&n).Error)
	return n
}

// failMarkSent makes db fail the next statement that records published
// events as sent once armed is true (it disarms itself), and counts the
// statements it failed. The
// statement runs as a query (UPDATE … RETURNING), so the hook sits on
// GORM's row callback; the raw one covers an Exec of it.
func failMarkSent(t *testing.T, db *gorm.DB, armed *atomic.Bool) *atomic.Int64 {
	t.Helper()
	var failed atomic.Int64
	hook := func(tx *gorm.DB) {
		sql := tx.Statement.SQL.String()
		if strings.HasPrefix(sql, "UPDATE outbox_events") && strings.Contains(sql, "status = 'sent'") &&
			armed.CompareAndSwap(true, false) {
			failed.Add(1)
			_ = tx.AddError(errInjected)
		}
	}
	require.NoError(t, db.Callback().Row().Before("gorm:row").Register("test:fail_mark_sent_row", hook))
	require.NoError(t, db.Callback().Raw().Before("gorm:raw").Register("test:fail_mark_sent_raw", hook))
	return &failed
}

// relayAll drains p until every outbox row is sent and the bus holds
// nothing: every message published was received and acked, so receipts
// are final.
func relayAll(t *testing.T, e *env, p *projector.OutboxProjector, rows int64) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, "every event sent, received and acked", func() bool {
		_, err := p.Drain(context.Background())
		require.NoError(t, err)
		return e.count(t, "status = 'sent'") == rows &&
			busRows(t, e.db, "dbbus_deliveries") == 0 && busRows(t, e.db, "dbbus_messages") == 0
	})
}

// TestDBBusHopOnceWhenMarkSentFailsAfterAck: a projector relays to a
// database bus on the outbox's own database, the bus's consumer group
// handles and acks each message, and recording the events as sent fails.
// Relaying the events again once their lease ends must not deliver them to
// the group a second time. A publish outside the transaction that marks
// the rows does: the bus's dedup by UUID only covers a message it still
// holds, and an acked message's body is gone.
func TestDBBusHopOnceWhenMarkSentFailsAfterAck(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db)
		var armed atomic.Bool
		armed.Store(true)
		failed := failMarkSent(t, db, &armed) // before anything uses db: registering races with queries
		bus := newDBBus(t, db)
		got := consume(t, bus)
		events := e.commit(t, counterIDs(3), 2)
		cfg := fastConfig()
		cfg.Lease, cfg.PublishTimeout = 300*time.Millisecond, 200*time.Millisecond
		p, err := projector.New(e.store, bus, cfg)
		require.NoError(t, err)

		// Relayed outside the transaction that marks the rows, the events
		// reach the group and the drain fails to record them; relayed in
		// it, nothing reaches the group, they count a failed attempt and
		// are relayed again.
		_, _ = p.Drain(context.Background())
		require.Equal(t, int64(1), failed.Load(), "recording the first batch as sent was the statement that failed")
		// Whatever reached the group is handled and acked before the events
		// are relayed again.
		testenv.WaitFor(t, 10*time.Second, "the group to hold nothing", func() bool {
			return busRows(t, db, "dbbus_deliveries") == 0 && busRows(t, db, "dbbus_messages") == 0
		})

		relayAll(t, e, p, int64(len(events)))
		counts := got.counts()
		assert.Len(t, counts, len(events))
		for i, id := range events {
			assert.Equal(t, 1, counts[id], "event %d (%s) delivered to the group once", i, id)
		}
	})
}

// TestDBBusDedupHidesRepublishWhileHeld: the same failure while the group
// has not acked the first publish yet. The bus still holds the message's
// body and skips the second publish of its UUID, so the group holds one
// delivery per event.
func TestDBBusDedupHidesRepublishWhileHeld(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db)
		var armed atomic.Bool
		armed.Store(true)
		failed := failMarkSent(t, db, &armed)
		bus := newDBBus(t, db)
		events := e.commit(t, counterIDs(4), 1)
		cfg := fastConfig()
		cfg.Lease, cfg.PublishTimeout = 300*time.Millisecond, 200*time.Millisecond
		p, err := projector.New(e.store, bus, cfg)
		require.NoError(t, err)

		_, _ = p.Drain(context.Background()) // either outcome, as above
		require.Equal(t, int64(1), failed.Load())
		testenv.WaitFor(t, 10*time.Second, "every event sent", func() bool {
			_, err := p.Drain(context.Background())
			require.NoError(t, err)
			return e.count(t, "status = 'sent'") == int64(len(events))
		})
		var perMessage []int64
		require.NoError(t, db.Raw(`SELECT count(*) FROM dbbus_deliveries WHERE group_name = ? GROUP BY message_id`, hopGroup).
			Scan(&perMessage).Error)
		assert.Len(t, perMessage, len(events))
		for _, n := range perMessage {
			assert.Equal(t, int64(1), n, "one delivery per event")
		}
	})
}

// TestDBBusHopRollsBackAndRetries: when recording a batch fails inside
// its transaction, the batch counts a failed attempt, its spans and
// metrics say so as on the broker path, and the retry publishes and
// marks it; with DeleteOnSuccess the rows are deleted in the transaction
// instead.
func TestDBBusHopRollsBackAndRetries(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		for _, del := range []bool{false, true} {
			t.Run(fmt.Sprintf("delete=%v", del), func(t *testing.T) {
				db := db
				if del {
					db = b.Open(t)
				}
				e := setup(t, db)
				var armed atomic.Bool
				armed.Store(true)
				failed := failMarkSent(t, db, &armed)
				if del { // the deleting statement fails instead
					require.NoError(t, db.Callback().Row().Before("gorm:row").Register("test:fail_delete_sent",
						func(tx *gorm.DB) {
							if strings.HasPrefix(tx.Statement.SQL.String(), "DELETE FROM outbox_events WHERE id IN") &&
								armed.CompareAndSwap(true, false) {
								failed.Add(1)
								_ = tx.AddError(errInjected)
							}
						}))
				}
				bus := newDBBus(t, db)
				got := consume(t, bus)
				events := e.commit(t, counterIDs(3), 1)
				rec := tracetest.NewSpanRecorder()
				tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
				t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				reg := prometheus.NewRegistry()
				cfg := fastConfig()
				cfg.TracerProvider, cfg.Registerer, cfg.DeleteOnSuccess = tp, reg, del
				p, err := projector.New(e.store, bus, cfg)
				require.NoError(t, err)

				// A Drain leaves rows whose retry is not due yet, and the
				// backoff may outlast the next claim: drain until they went out.
				var res projector.Result
				for i := 0; i < 200 && res.Published < len(events); i++ {
					r, err := p.Drain(context.Background())
					require.NoError(t, err)
					res.Claimed, res.Published, res.Failed = res.Claimed+r.Claimed, res.Published+r.Published, res.Failed+r.Failed
					res.Dead, res.Released = res.Dead+r.Dead, res.Released+r.Released
					if res.Published < len(events) {
						time.Sleep(5 * time.Millisecond) // the backoff ceiling
					}
				}
				require.Equal(t, int64(1), failed.Load(), "the first batch's record failed")
				assert.Equal(t, projector.Result{Claimed: 6, Published: 3, Failed: 3}, res,
					"the batch failed once as a whole, then went out")
				if del {
					assert.Zero(t, e.count(t, ""), "deleted in the publishing transaction")
				} else {
					assert.Equal(t, int64(3), e.count(t, "status = 'sent' AND attempts = 1 AND locked_by IS NULL"))
				}
				assert.Equal(t, 3.0, counterSum(t, reg, "bento_outbox_published_total"))
				assert.Equal(t, 3.0, counterSum(t, reg, "bento_outbox_failed_total"))

				spans := map[string][]sdktrace.ReadOnlySpan{}
				for _, s := range rec.Ended() {
					if s.Name() == "bento.publish counter.ticked" {
						id := spanAttr(s, "messaging.message.id")
						spans[id] = append(spans[id], s)
					}
				}
				for _, id := range events {
					require.Len(t, spans[id], 2, "one span per attempt of %s", id)
					assert.Equal(t, codes.Error, spans[id][0].Status().Code)
					assert.Contains(t, spans[id][0].Status().Description, errInjected.Error())
					assert.Equal(t, codes.Unset, spans[id][1].Status().Code)
					assert.Equal(t, "2", spanAttr(spans[id][1], "bento.outbox.attempt"))
				}

				testenv.WaitFor(t, 10*time.Second, "the group to handle every event", func() bool {
					return busRows(t, db, "dbbus_deliveries") == 0 && len(got.counts()) == len(events)
				})
				counts := got.counts()
				for _, id := range events {
					assert.Equal(t, 1, counts[id], "event %s delivered once", id)
				}
				for _, id := range events {
					assert.Equal(t, traceparentOf(spans[id][1].SpanContext()), got.traceparent(id),
						"the message carries the span of the attempt that published it")
				}
			})
		}
	})
}

// onStart is a span processor that calls fn as each span starts. A
// publish span starts after the projector claimed its batch and before
// the transaction that publishes it, so fn runs between the two.
type onStart func()

func (f onStart) OnStart(context.Context, sdktrace.ReadWriteSpan) { f() }
func (onStart) OnEnd(sdktrace.ReadOnlySpan)                       {}
func (onStart) Shutdown(context.Context) error                    { return nil }
func (onStart) ForceFlush(context.Context) error                  { return nil }

// leaseLost counts the ended publish spans whose attempt lost its lease.
func leaseLost(rec *tracetest.SpanRecorder) int {
	n := 0
	for _, s := range rec.Ended() {
		if s.Status().Code == codes.Error && strings.Contains(s.Status().Description, "lease lost") {
			n++
		}
	}
	return n
}

// TestDBBusHopLeaseLostCommitsNothing: between a projector's claim and its
// transaction, its lease runs out and another worker claims two of its
// four rows. The projector must publish and mark none of the four, not
// even the two still leased to it, which it releases and relays in its
// next batch; the other two are left to their new owner, and once that
// one is gone for good, are taken over and relayed once.
func TestDBBusHopLeaseLostCommitsNothing(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db)
		ctx := context.Background()
		clock := testenv.NewClock(time.Now().Add(time.Minute))
		store, err := outbox.NewStore(db, &outbox.Config{Test: outbox.TestConfig{Clock: clock}})
		require.NoError(t, err)
		bus := newDBBus(t, db)
		got := consume(t, bus)
		events := e.commit(t, counterIDs(4), 1)

		var (
			once     sync.Once
			stolen   []*outbox.Message
			stealErr error
		)
		steal := onStart(func() {
			once.Do(func() {
				clock.Advance(time.Minute) // past the projector's lease
				stolen, stealErr = store.Claim(ctx, outbox.ClaimOpts{Worker: "thief", Limit: 2, Lease: time.Hour})
			})
		})
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(steal), sdktrace.WithSpanProcessor(rec))
		t.Cleanup(func() { _ = tp.Shutdown(ctx) })
		cfg := fastConfig()
		cfg.WorkerID, cfg.TracerProvider = "victim", tp
		p, err := projector.New(store, bus, cfg)
		require.NoError(t, err)

		res, err := p.Drain(ctx)
		require.NoError(t, err)
		require.NoError(t, stealErr)
		require.Len(t, stolen, 2)
		assert.Equal(t, projector.Result{Claimed: 6, Published: 2, Released: 4}, res,
			"the first batch of four is released whole; the two rows still the projector's go out next")
		assert.Equal(t, 4, leaseLost(rec), "every publish of the first batch ends with the lost lease")
		for _, m := range stolen {
			assert.Equal(t, int64(1), e.count(t, "id = ? AND status = 'publishing' AND locked_by = 'thief'", m.ID),
				"the new owner's row %s is left alone", m.ID)
			var held int64
			require.NoError(t, db.Table("dbbus_messages").Where("id = ?", m.ID).Count(&held).Error)
			assert.Zero(t, held, "nothing of %s reached the bus", m.ID)
		}
		assert.Equal(t, int64(2), e.count(t, "status = 'sent'"))

		// The thief never records its rows: once its lease ends, the
		// projector takes them over and relays them.
		clock.Advance(2 * time.Hour)
		relayAll(t, e, p, int64(len(events)))
		counts := got.counts()
		assert.Len(t, counts, len(events))
		for _, id := range events {
			assert.Equal(t, 1, counts[id], "event %s delivered once", id)
		}
	})
}

// stallingBus is the database bus with a hook that runs inside the
// publishing transaction, before each PublishTx.
type stallingBus struct {
	*dbbus.Bus
	stall func()
}

func (s stallingBus) PublishTx(tx *gorm.DB, topic string, msgs ...*message.Message) error {
	s.stall()
	return s.Bus.PublishTx(tx, topic, msgs...)
}

// TestDBBusHopRacingProjectorsPublishOnce: two projectors relay one outbox
// to the bus at once while events are committed, one of them stalling
// now and then past its lease, before its transaction (the other takes
// its rows over) or inside it (it holds the rows meanwhile). Its first
// stall lasts until the other took its batch over and relayed it, so it
// certainly tries to publish rows it lost, which are on the bus already,
// and the fence (not a timeout waiting for the other's transaction, nor a
// later retry of rows the other failed to publish) is what stops it. Every
// event must reach the group exactly once.
func TestDBBusHopRacingProjectorsPublishOnce(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db)
		bus := newDBBus(t, db)
		got := consume(t, bus)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		config := func(worker string) *projector.Config {
			cfg := fastConfig()
			cfg.WorkerID, cfg.BatchSize, cfg.MaxAttempts = worker, 10, 1000
			cfg.Lease, cfg.PublishTimeout = 500*time.Millisecond, 400*time.Millisecond
			return cfg
		}
		// stall plays a stalled process for d, or until the test ends.
		stall := func(d time.Duration) {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
		var wg sync.WaitGroup
		run := func(p *projector.OutboxProjector) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				assert.NoError(t, p.Run(ctx))
			}()
		}
		fast, err := projector.New(e.store, bus, config("fast"))
		require.NoError(t, err)

		// The slow projector's first batch is the whole outbox so far.
		first := make([]string, 10)
		for i := range first {
			first[i] = fmt.Sprintf("first-%d", i)
		}
		events := e.commit(t, first, 1)
		var (
			started    atomic.Int64
			firstStall sync.Once
			tookOver   = make(chan bool, 1)
		)
		before := onStart(func() {
			firstStall.Do(func() {
				// Holding its first batch: start the other projector and go
				// on once it took every row of the batch over and marked it
				// sent. Going on as soon as the rows were taken over would
				// race the other's transaction: under load the slow one's
				// fence could time out waiting for its row locks, or the
				// other's publish time out and the slow one relay the rows
				// later, both correct but not the lost lease this attacks.
				run(fast)
				tookOver <- testenv.Poll(20*time.Second, func() bool {
					var n int64
					return db.Model(&outbox.Message{}).Where("aggregate_id IN ? AND status = 'sent'", first).
						Count(&n).Error == nil && n == int64(len(first))
				})
			})
			if started.Add(1)%23 == 0 {
				stall(600 * time.Millisecond)
			}
		})
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(before), sdktrace.WithSpanProcessor(rec))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		var calls atomic.Int64
		inside := stallingBus{Bus: bus, stall: func() {
			if calls.Add(1)%4 == 0 {
				stall(300 * time.Millisecond)
			}
		}}
		slowCfg := config("slow")
		slowCfg.TracerProvider = tp
		slow, err := projector.New(e.store, inside, slowCfg)
		require.NoError(t, err)
		run(slow)
		select {
		case ok := <-tookOver:
			require.True(t, ok, "the other projector took the first batch over and relayed it")
		case <-time.After(30 * time.Second):
			t.Fatal("the slow projector never started its first batch")
		}
		// The rest is committed once the slow projector tried its first
		// batch, so that its transaction meets no writers but the other
		// projector.
		testenv.WaitFor(t, 10*time.Second, "the slow projector to try its first batch", func() bool {
			return len(rec.Ended()) >= len(first)
		})

		events = append(events, e.commit(t, counterIDs(40), 3)...)
		testenv.WaitFor(t, 60*time.Second, "every event sent, received and acked", func() bool {
			return e.count(t, "status = 'sent'") == int64(len(events)) &&
				busRows(t, db, "dbbus_deliveries") == 0 && busRows(t, db, "dbbus_messages") == 0
		})
		cancel()
		wg.Wait()
		lost := 0
		for _, s := range rec.Ended() {
			if slices.Contains(first, spanAttr(s, "bento.aggregate.id")) {
				assert.Equal(t, codes.Error, s.Status().Code, "the slow projector's publish of its first batch")
				assert.Contains(t, s.Status().Description, "lease lost")
				lost++
			}
		}
		assert.Equal(t, len(first), lost, "the slow projector tried its first batch once")
		t.Logf("the slow projector's publishes: %d, of which lost their lease: %d", len(rec.Ended()), leaseLost(rec))
		counts := got.counts()
		assert.Len(t, counts, len(events))
		for _, id := range events {
			assert.Equal(t, 1, counts[id], "event %s delivered once", id)
		}
	})
}
