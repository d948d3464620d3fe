package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/messaging"
)

// The bare due-time poller: what a team without a framework would write.
// Its own plain table with an index on due_at; a loop that, in one
// transaction, selects up to 500 due rows FOR UPDATE SKIP LOCKED, publishes
// them with confirms, deletes them and commits, and sleeps a short while
// when nothing was due. pgx and amqp091 directly.
const (
	peerSchedTableSQL = `CREATE TABLE IF NOT EXISTS bare_scheduled (
  id bigint PRIMARY KEY,
  topic text NOT NULL,
  payload bytea NOT NULL,
  due_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS bare_scheduled_due ON bare_scheduled (due_at);
TRUNCATE bare_scheduled`
	peerSchedSelectSQL = `SELECT id, topic, payload, due_at FROM bare_scheduled
WHERE due_at <= now() ORDER BY due_at LIMIT 500 FOR UPDATE SKIP LOCKED`
	peerSchedDeleteSQL = `DELETE FROM bare_scheduled WHERE id = ANY($1)`
)

// schedPeer writes cfg.Messages into the bare poller's table (one COPY)
// and runs the poller over it, publishing to RabbitMQ, and measures how
// late after its due time each arrives.
func schedPeer(ctx context.Context, b *steadyBed, cfg scheduledConfig) (schedRun, error) {
	names := newAMQPNames()
	defer func() {
		if err := b.e.deleteTopology(names); err != nil {
			b.e.log.Warn("cleanup", "err", err)
		}
	}()
	if err := declareSchedTopology(b.e, names); err != nil {
		return schedRun{}, err
	}
	tr := newSchedTracker(cfg.Messages)
	stop, err := startSchedReceiver(b.e, names.Queue, tr)
	if err != nil {
		return schedRun{}, err
	}
	defer stop()
	conn, err := pgx.Connect(ctx, b.schema.DSN)
	if err != nil {
		return schedRun{}, err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, peerSchedTableSQL); err != nil {
		return schedRun{}, err
	}

	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	done := make(chan error, 1)
	go func() { done <- peerPoll(pctx, b, names.Exchange, cfg.PeerPoll) }()
	stopPoller := func() error {
		pcancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}

	start := time.Now()
	t0 := start.Add(cfg.Lead)
	rows := make([][]any, cfg.Messages)
	for i := range rows {
		body, _ := json.Marshal(schedPayload{Seq: i})
		rows[i] = []any{int64(i), scheduledTopic, body, dueTime(t0, i, cfg.Messages, cfg.Spread)}
	}
	_, err = conn.CopyFrom(ctx, pgx.Identifier{"bare_scheduled"}, []string{"id", "topic", "payload", "due_at"}, pgx.CopyFromRows(rows))
	sched := time.Since(start)
	if err == nil && time.Now().After(t0) {
		err = fmt.Errorf("writing %d rows took %v, longer than the lead %v", cfg.Messages, sched, cfg.Lead)
	}
	if err != nil {
		return schedRun{}, errors.Join(err, stopPoller())
	}
	waitSched(ctx, tr, cfg.Messages, t0.Add(cfg.Spread), schedIdle, 500*time.Millisecond)
	r := tr.run("bare-poller", fmt.Sprintf("bare SKIP LOCKED poller, %v sleep (peer)", cfg.PeerPoll), sched)
	return r, errors.Join(ctx.Err(), stopPoller())
}

// declareSchedTopology declares the exchange and queue of n with the queue
// bound to scheduledTopic.
func declareSchedTopology(e *env, n amqpNames) error {
	return e.withChannel(func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(n.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(n.Queue, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(n.Queue, scheduledTopic, n.Exchange, false, nil)
	})
}

// peerPoll is the bare poller's loop, until ctx ends.
func peerPoll(ctx context.Context, b *steadyBed, exchange string, sleep time.Duration) error {
	conn, err := pgx.Connect(ctx, b.schema.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	ac, err := amqp.Dial(b.e.amqpURL)
	if err != nil {
		return err
	}
	defer ac.Close()
	ch, err := ac.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	for ctx.Err() == nil {
		n, err := peerPollOnce(ctx, conn, ch, exchange)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if n > 0 {
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(sleep):
		}
	}
	return nil
}

// peerPollOnce relays the due rows of one SELECT in one transaction and
// returns how many.
func peerPollOnce(ctx context.Context, conn *pgx.Conn, ch *amqp.Channel, exchange string) (int, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op after Commit
	rows, err := tx.Query(ctx, peerSchedSelectSQL)
	if err != nil {
		return 0, err
	}
	type row struct {
		id      int64
		topic   string
		payload []byte
		due     time.Time
	}
	var batch []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.id, &r.topic, &r.payload, &r.due); err != nil {
			rows.Close()
			return 0, err
		}
		batch = append(batch, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(batch) == 0 {
		return 0, tx.Commit(ctx)
	}
	ids := make([]int64, len(batch))
	keys := make([]string, len(batch))
	pubs := make([]amqp.Publishing, len(batch))
	for i, r := range batch {
		ids[i], keys[i] = r.id, r.topic
		pubs[i] = amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: "application/json", MessageId: fmt.Sprint(r.id),
			Headers: amqp.Table{messaging.MetaDueAt: r.due.UTC().Format(time.RFC3339Nano)}, Body: r.payload}
	}
	if err := publishConfirmed(ctx, ch, exchange, keys, pubs); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, peerSchedDeleteSQL, ids); err != nil {
		return 0, err
	}
	return len(batch), tx.Commit(ctx)
}

// The bare cancel: the same cancels as bento's, paced the same way, as
// plain DELETEs by key over pgx on a plain table with the key as its
// primary key. Nothing is relayed: it measures what cancelling by key costs
// the database here, the ceiling bento's cancels are read against.
const peerCancelTableSQL = `CREATE TABLE IF NOT EXISTS bare_cancel (
  key text PRIMARY KEY,
  due_at timestamptz NOT NULL
);
TRUNCATE bare_cancel`

// cancelPeer fills bare_cancel with n keys and deletes every other one, as
// bento's cancellation does (targets of them, cfg.cancelsPerTx() per
// transaction, from cfg.Cancellers connections at cfg.CancelRate). It
// returns the deletes per second and the transactions' latencies.
func cancelPeer(ctx context.Context, b *steadyBed, cfg scheduledConfig, targets int) (float64, latencies, error) {
	n := cfg.CancelMessages
	pcfg, err := pgxpool.ParseConfig(b.schema.DSN)
	if err != nil {
		return 0, latencies{}, err
	}
	pcfg.MaxConns = int32(cfg.Cancellers)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return 0, latencies{}, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, peerCancelTableSQL); err != nil {
		return 0, latencies{}, err
	}
	due := time.Now().Add(time.Hour)
	rows := make([][]any, n)
	for i := range rows {
		rows[i] = []any{fmt.Sprint("k-", i), due}
	}
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{"bare_cancel"}, []string{"key", "due_at"}, pgx.CopyFromRows(rows)); err != nil {
		return 0, latencies{}, err
	}
	if _, err := pool.Exec(ctx, "ANALYZE bare_cancel"); err != nil {
		return 0, latencies{}, err
	}
	var (
		mu     sync.Mutex
		firstE error
		missed int
	)
	achieved, took := paceCancels(ctx, cfg, targets, func(ctx context.Context, seqs []int) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, j := range seqs {
				tag, err := tx.Exec(ctx, `DELETE FROM bare_cancel WHERE key = $1`, fmt.Sprint("k-", 2*j+1))
				if err != nil {
					return err
				}
				if tag.RowsAffected() != 1 {
					mu.Lock()
					missed++
					mu.Unlock()
				}
			}
			return nil
		})
		if err != nil {
			mu.Lock()
			if firstE == nil {
				firstE = err
			}
			mu.Unlock()
		}
	})
	if firstE == nil && missed > 0 {
		firstE = fmt.Errorf("%d deletes found no row", missed)
	}
	return achieved, summarize(took), firstE
}
