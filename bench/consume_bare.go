package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// bareConsumeBatch is how many deliveries one transaction of the bare
// batched consumer applies, and bareConsumeWait how long it waits for a
// batch to fill once it has its first delivery.
const (
	bareConsumeBatch = 100
	bareConsumeWait  = 5 * time.Millisecond
)

const (
	// bareInboxSQL records a batch in the inbox and returns the ids that
	// were not there yet: the ones to apply.
	bareInboxSQL = `INSERT INTO inbox_messages (consumer, message_id, tenant_id, received_at)
SELECT $1, id, 'default', now() FROM unnest($2::text[]) AS id
ON CONFLICT DO NOTHING RETURNING message_id`
	// bareEffectsSQL is the write handler's insert, for a whole batch.
	bareEffectsSQL = `INSERT INTO ` + receiptsTable + ` (event_id, account_id, amount)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`
)

// runBareConsume is the consume scenario's limit: amqp091 and pgx directly,
// no Watermill, no GORM, no decoding beyond the payload, no order, no
// retries. n loops each consume the group's queue on a channel of their own
// (prefetch two batches) and repeat: take up to bareConsumeBatch deliveries
// (or what arrived within bareConsumeWait of the first); BEGIN; one
// multi-row INSERT ... ON CONFLICT DO NOTHING RETURNING into inbox_messages;
// for the write handler one multi-row insert of the new deliveries' effects;
// COMMIT; then one ack with multiple set, after the commit.
func runBareConsume(ctx context.Context, b *consumeBed, group, handler string, n int, c *counter) error {
	ac, err := amqp.Dial(b.e.amqpURL)
	if err != nil {
		return err
	}
	defer ac.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := bareConsumeLoop(ctx, b, ac, group, handler, c); err != nil && ctx.Err() == nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				cancel()
			}
		}()
	}
	select {
	case <-c.done:
	case <-ctx.Done():
	}
	cancel()
	wg.Wait()
	return errors.Join(errs...)
}

// bareConsumeLoop is one loop of runBareConsume, until ctx ends.
func bareConsumeLoop(ctx context.Context, b *consumeBed, ac *amqp.Connection, group, handler string, c *counter) error {
	conn, err := pgx.Connect(ctx, b.schema.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	ch, err := ac.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Qos(2*bareConsumeBatch, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(group, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	batch := make([]amqp.Delivery, 0, bareConsumeBatch)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("deliveries closed")
			}
			// The clock starts at the first delivery, not the first commit.
			c.first.CompareAndSwap(0, time.Now().UnixNano())
			batch = append(batch, d)
		}
		fill := time.NewTimer(bareConsumeWait)
	filling:
		for len(batch) < bareConsumeBatch {
			select {
			case d, ok := <-deliveries:
				if !ok {
					break filling
				}
				batch = append(batch, d)
			case <-fill.C:
				break filling
			}
		}
		fill.Stop()
		applied, err := bareApply(ctx, conn, group, handler, batch)
		if err != nil {
			return err
		}
		if err := batch[len(batch)-1].Ack(true); err != nil {
			return err
		}
		for range applied {
			c.add()
		}
	}
}

// bareApply applies one batch in one transaction and returns how many of
// its deliveries were new.
func bareApply(ctx context.Context, conn *pgx.Conn, group, handler string, batch []amqp.Delivery) (int, error) {
	ids := make([]string, len(batch))
	byID := make(map[string]amqp.Delivery, len(batch))
	for i, d := range batch {
		ids[i] = d.MessageId
		byID[d.MessageId] = d
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	rows, err := tx.Query(ctx, bareInboxSQL, group, ids)
	if err != nil {
		return 0, err
	}
	fresh, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, err
	}
	if handler == "write" && len(fresh) > 0 {
		accounts, amounts := make([]string, len(fresh)), make([]int64, len(fresh))
		for i, id := range fresh {
			var e Deposited
			if err := json.Unmarshal(byID[id].Body, &e); err != nil {
				return 0, fmt.Errorf("message %s: %w", id, err)
			}
			accounts[i], amounts[i] = e.AccountID, e.Amount
		}
		if _, err := tx.Exec(ctx, bareEffectsSQL, fresh, accounts, amounts); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return len(fresh), nil
}
