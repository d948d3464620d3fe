package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/uow"
)

// peerRelay is Watermill's outbox as runPeer builds it (watermill-sql
// subscriber → forwarder → watermill-amqp publisher with confirms), with
// the subscriber polling every poll, running until stopped.
type peerRelay struct {
	sqlDB  *sql.DB
	sub    *wsql.Subscriber
	pub    *wamqp.Publisher
	app    string
	cancel context.CancelFunc
	done   chan error
}

func startPeerRelay(ctx context.Context, b *steadyBed, names amqpNames, poll time.Duration) (r *peerRelay, err error) {
	wlog := watermill.NewSlogLogger(b.e.log)
	r = &peerRelay{app: "bench-peer-" + randomHex(4)}
	if r.sqlDB, err = sql.Open("pgx", b.schema.DSN+" application_name="+r.app); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			r.closeConns()
		}
	}()
	for _, t := range []string{`"watermill_` + forwarderTopic + `"`, `"watermill_offsets_` + forwarderTopic + `"`} {
		if _, err := r.sqlDB.ExecContext(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
			return nil, err
		}
	}
	r.sub, err = wsql.NewSubscriber(wsql.BeginnerFromStdSQL(r.sqlDB), wsql.SubscriberConfig{
		ConsumerGroup:    "bench",
		PollInterval:     poll,
		SchemaAdapter:    wsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
	}, wlog)
	if err != nil {
		return nil, err
	}
	if err := r.sub.SubscribeInitialize(forwarderTopic); err != nil {
		return nil, fmt.Errorf("initialize watermill-sql schema: %w", err)
	}
	cfg := wamqp.NewDurablePubSubConfig(b.e.amqpURL, nil)
	cfg.Exchange = wamqp.ExchangeConfig{GenerateName: func(string) string { return names.Exchange }, Type: "topic", Durable: true}
	cfg.Publish.GenerateRoutingKey = func(t string) string { return t }
	cfg.Publish.ConfirmDelivery, cfg.Publish.ChannelPoolSize = true, 16
	if r.pub, err = wamqp.NewPublisher(cfg, wlog); err != nil {
		return nil, err
	}
	fwd, err := forwarder.NewForwarder(r.sub, r.pub, wlog, forwarder.Config{ForwarderTopic: forwarderTopic, CloseTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	ctx, r.cancel = context.WithCancel(ctx)
	r.done = make(chan error, 1)
	go func() { r.done <- fwd.Run(ctx) }()
	select {
	case <-fwd.Running():
	case err := <-r.done:
		r.cancel()
		return nil, fmt.Errorf("forwarder: %w", err)
	}
	return r, nil
}

func (r *peerRelay) stop() error {
	r.cancel()
	err := <-r.done
	r.closeConns()
	return err
}

func (r *peerRelay) closeConns() {
	if r.pub != nil {
		_ = r.pub.Close()
	}
	if r.sub != nil {
		_ = r.sub.Close()
	}
	_ = r.sqlDB.Close()
}

// peerCommit is the peer's unit of work: the same account UPDATE as
// gormSave and the event written through watermill-sql's publisher wrapped
// in forwarder.NewPublisher, in one GORM transaction.
func peerCommit(b *steadyBed) commitFunc {
	wlog := watermill.NewSlogLogger(b.e.log)
	return func(ctx context.Context, a *Account, seq int) error {
		payload, err := json.Marshal(a.deposited(1, seqRef(seq)))
		if err != nil {
			return err
		}
		msg := message.NewMessage(watermill.NewULID(), payload)
		next := a.Version + 1
		err = b.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			res := tx.Model(a).Where("version = ?", a.Version).
				Updates(map[string]any{"balance": a.Balance + 1, "version": next})
			if res.Error == nil && res.RowsAffected != 1 {
				return uow.ErrConcurrencyConflict
			}
			if res.Error != nil {
				return res.Error
			}
			sqlPub, err := wsql.NewPublisher(gormExec{tx.Statement.ConnPool},
				wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, wlog)
			if err != nil {
				return err
			}
			return forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic}).Publish(topic, msg)
		})
		if err == nil {
			a.Balance++
			a.Version = next
		}
		return err
	}
}

// runSteadyPeer measures Watermill's forwarder at rate with the given poll.
func runSteadyPeer(ctx context.Context, b *steadyBed, rate float64, poll time.Duration) (steadyRun, error) {
	names := newAMQPNames()
	defer func() {
		if err := b.e.deleteTopology(names); err != nil {
			b.e.log.Warn("cleanup", "err", err)
		}
	}()
	if err := declarePlainTopology(b.e, names); err != nil {
		return steadyRun{}, err
	}
	relay, err := startPeerRelay(ctx, b, names, poll)
	if err != nil {
		return steadyRun{}, err
	}
	r, err := measureRate(ctx, b, fromQueue(b.e, names.Queue), rate, "peer-"+randomHex(3), peerCommit(b))
	return r, errors.Join(err, relay.stop())
}

// idlePeer measures the CPU Watermill's forwarder uses while nothing is
// written, polling every poll.
func idlePeer(ctx context.Context, b *steadyBed, poll time.Duration) (IdleCPU, error) {
	names := newAMQPNames()
	defer func() {
		if err := b.e.deleteTopology(names); err != nil {
			b.e.log.Warn("cleanup", "err", err)
		}
	}()
	if err := declarePlainTopology(b.e, names); err != nil {
		return IdleCPU{}, err
	}
	relay, err := startPeerRelay(ctx, b, names, poll)
	if err != nil {
		return IdleCPU{}, err
	}
	idle, err := measureIdle(ctx, b, []string{relay.app}, nil)
	idle.Key = "watermill-forwarder-" + poll.String()
	idle.Label = fmt.Sprintf("Watermill forwarder, %v poll (peer)", poll)
	return idle, errors.Join(err, relay.stop())
}
