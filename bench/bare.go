package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// bareBatch is how many rows one transaction of the bare loop relays.
const bareBatch = 500

const (
	// bareSelectSQL is the loop's SELECT as specified. Ordered by id, it
	// walks the primary key past every row already sent, so each batch
	// costs more than the one before.
	bareSelectSQL = `SELECT id, topic, payload FROM outbox_events
WHERE status IN ('new', 'failed') ORDER BY id LIMIT 500 FOR UPDATE SKIP LOCKED`
	// bareIndexedSelectSQL selects the same rows in the order of bento's
	// partial index outbox_events_ready, which holds only unsent rows.
	bareIndexedSelectSQL = `SELECT id, topic, payload FROM outbox_events
WHERE status IN ('new', 'publishing', 'failed') ORDER BY available_at, id LIMIT 500 FOR UPDATE SKIP LOCKED`
	bareUpdateSQL = `UPDATE outbox_events SET status = 'sent', published_at = now() WHERE id = ANY($1)`
)

// runBare times the practical limit: pgx and amqp091 directly, no GORM, no
// leases, no per-aggregate order, no metadata headers. Repeat: BEGIN;
// selectSQL (500 unsent rows FOR UPDATE SKIP LOCKED); publish them all
// pipelined on a channel in confirm mode; wait for every confirm; mark them
// sent; COMMIT.
func runBare(ctx context.Context, e *env, b *backlog, selectSQL string) (drainRun, error) {
	if err := b.reload(ctx); err != nil {
		return drainRun{}, err
	}
	names := newAMQPNames()
	defer func() {
		if err := e.deleteTopology(names); err != nil {
			e.log.Warn("cleanup", "err", err)
		}
	}()
	if err := declarePlainTopology(e, names); err != nil {
		return drainRun{}, err
	}
	conn, err := pgx.Connect(ctx, b.schema.DSN)
	if err != nil {
		return drainRun{}, err
	}
	defer conn.Close(context.Background())
	ac, err := amqp.Dial(e.amqpURL)
	if err != nil {
		return drainRun{}, err
	}
	defer ac.Close()
	ch, err := ac.Channel()
	if err != nil {
		return drainRun{}, err
	}
	if err := ch.Confirm(false); err != nil {
		return drainRun{}, err
	}

	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	start := time.Now()
	sent := 0
	var phases barePhases
	for {
		n, err := bareBatchOnce(ctx, conn, ch, names.Exchange, selectSQL, &phases)
		if err != nil {
			return drainRun{}, err
		}
		if n == 0 {
			break
		}
		sent += n
	}
	elapsed := time.Since(start)
	if sent != b.n {
		return drainRun{}, fmt.Errorf("bare loop sent %d rows, want %d", sent, b.n)
	}
	if _, err := e.waitDepth(ctx, names.Queue, b.n, 30*time.Second); err != nil {
		return drainRun{}, err
	}
	r := newDrainRun(b.n, elapsed)
	r.ClaimSeconds, r.SettleSeconds = phases.selectD.Seconds(), phases.settleD.Seconds()
	return r, nil
}

// barePhases adds up the time spent in the SELECT and in UPDATE + COMMIT.
type barePhases struct{ selectD, settleD time.Duration }

type bareRow struct {
	id, topic string
	payload   []byte
}

// bareBatchOnce relays one batch in one transaction and returns its size.
func bareBatchOnce(ctx context.Context, conn *pgx.Conn, ch *amqp.Channel, exchange, selectSQL string, ph *barePhases) (int, error) {
	t0 := time.Now()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op after Commit
	rows, err := tx.Query(ctx, selectSQL)
	if err != nil {
		return 0, err
	}
	batch := make([]bareRow, 0, bareBatch)
	for rows.Next() {
		var r bareRow
		if err := rows.Scan(&r.id, &r.topic, &r.payload); err != nil {
			rows.Close()
			return 0, err
		}
		batch = append(batch, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	ph.selectD += time.Since(t0)
	if len(batch) == 0 {
		return 0, tx.Commit(ctx)
	}
	ids := make([]string, len(batch))
	keys := make([]string, len(batch))
	pubs := make([]amqp.Publishing, len(batch))
	for i, r := range batch {
		ids[i], keys[i] = r.id, r.topic
		pubs[i] = amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: "application/json", MessageId: r.id, Body: r.payload}
	}
	if err := publishConfirmed(ctx, ch, exchange, keys, pubs); err != nil {
		return 0, err
	}
	t1 := time.Now()
	defer func() { ph.settleD += time.Since(t1) }()
	if _, err := tx.Exec(ctx, bareUpdateSQL, ids); err != nil {
		return 0, err
	}
	return len(batch), tx.Commit(ctx)
}

// publishConfirmed publishes pubs[i] to exchange under routing key
// keys[i] on ch, which is in confirm mode, and waits for every confirm; a
// nack is an error naming the message.
func publishConfirmed(ctx context.Context, ch *amqp.Channel, exchange string, keys []string, pubs []amqp.Publishing) error {
	confirms := make([]*amqp.DeferredConfirmation, len(pubs))
	for i, p := range pubs {
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, keys[i], false, false, p)
		if err != nil {
			return fmt.Errorf("publish %s: %w", p.MessageId, err)
		}
		confirms[i] = c
	}
	for i, c := range confirms {
		ok, err := c.WaitContext(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("broker nacked " + pubs[i].MessageId)
		}
	}
	return nil
}
