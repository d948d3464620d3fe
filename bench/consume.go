package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/rabbitmq"
	"github.com/bentoevents/bento/uow"
)

// consumeConfig sizes the consumer scenario.
type consumeConfig struct {
	Messages    int      `json:"messages"`
	Concurrency []int    `json:"consumers"`
	Handlers    []string `json:"handlers"`
	Modes       []string `json:"modes"`
}

// consumeHandlers are the handlers measured, with and without the inbox:
// "noop" decodes the event and counts it, "write" also inserts one row
// (through the transaction it is handed: with the inbox, the inbox's
// transaction; without it, the database, a statement of its own).
var consumeHandlers = []string{"noop", "write"}

// consumeModes are the ways each handler is run: "inbox" is
// consumer.NewAMQP, "plain" the same handler on a Watermill router
// without the inbox, "direct" the inbox middleware called in a loop
// without any broker (what the inbox's transaction costs alone),
// "batched" consumer.NewAMQP on n partitions applying up to
// consumeBatchSize messages per transaction, "bare" the limit: a batched
// exactly-once loop on amqp091 and pgx (see runBareConsume), "dbbus" the
// batched mode on the database bus instead of RabbitMQ (see
// runDatabaseBus), "wmsql" the handler without the inbox on watermill-sql's
// PostgreSQL subscriber (see runWatermillSQL).
var consumeModes = []string{"inbox", "plain", "direct", "batched", "bare", "dbbus", "wmsql"}

// consumeBatchSize is the batched mode's consumer.Config.BatchSize.
const consumeBatchSize = 100

// directMax caps the messages of the "direct" mode, which is there to
// take the broker out of the picture, not to be timed at length.
const directMax = 5000

// receiptsTable is what the "write" handler inserts into.
const receiptsTable = "bench_receipts"

// consumeRun is one handler, mode and consumer count in one run.
type consumeRun struct {
	Handler   string  `json:"handler"`
	Mode      string  `json:"mode"`
	Consumers int     `json:"consumers"`
	Messages  int     `json:"messages"`
	Seconds   float64 `json:"seconds"`
	Rate      float64 `json:"messages_per_second"`
	// InboxInsert times the inbox's INSERT statements (inbox and direct
	// modes), Write the handler's (write handler): one round trip each,
	// so they show how busy PostgreSQL was.
	InboxInsert *latencies `json:"inbox_insert,omitempty"`
	Write       *latencies `json:"handler_insert,omitempty"`
	// Idle is the CPU the drained consumer used afterwards ("dbbus" mode).
	Idle *IdleCPU `json:"idle,omitempty"`
	// Stalled is set when the "wmsql" mode's subscriber stalled behind a
	// transaction open since before the messages were published: what
	// held it back. Such a run has no rate and is left out of the summary.
	Stalled *stall `json:"stalled,omitempty"`
}

// consumeKey names a measurement in the results, e.g. "inbox/write/x8".
func consumeKey(mode, handler string, consumers int) string {
	return fmt.Sprintf("%s/%s/x%d", mode, handler, consumers)
}

// counter counts handled messages and notes when the first and the
// want-th were handled.
type counter struct {
	want        int64
	n           atomic.Int64
	first, last atomic.Int64 // UnixNano
	done        chan struct{}
}

func newCounter(want int) *counter { return &counter{want: int64(want), done: make(chan struct{})} }

func (c *counter) add() {
	now := time.Now().UnixNano()
	c.first.CompareAndSwap(0, now)
	if c.n.Add(1) == c.want {
		c.last.Store(now)
		close(c.done)
	}
}

// rate is the messages per second between the first and the want-th
// message handled: want-1 messages after the first.
func (c *counter) rate() (seconds, rate float64) {
	d := time.Duration(c.last.Load() - c.first.Load())
	if d <= 0 || c.want < 2 {
		return d.Seconds(), 0
	}
	return d.Seconds(), float64(c.want-1) / d.Seconds()
}

// handlerFunc is the handler under test: the same function with and
// without the inbox.
func handlerFunc(kind string, c *counter) consumer.HandlerFunc[Deposited] {
	return func(ctx context.Context, tx *gorm.DB, e Deposited, env *messaging.Envelope) error {
		if kind == "write" {
			err := tx.Exec("INSERT INTO "+receiptsTable+" (event_id, account_id, amount) VALUES (?, ?, ?)",
				env.ID, e.AccountID, e.Amount).Error
			if err != nil {
				return err
			}
		}
		c.add()
		return nil
	}
}

// consumeBed is the schema and messages of one run.
type consumeBed struct {
	e      *env
	schema *pgSchema
	db     *gorm.DB
	msgs   []messaging.Outgoing
	cfg    consumeConfig
}

func newConsumeBed(ctx context.Context, e *env, cfg consumeConfig) (b *consumeBed, err error) {
	s, err := e.newSchema(ctx)
	if err != nil {
		return nil, err
	}
	b = &consumeBed{e: e, schema: s, cfg: cfg}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	maxC := 1
	for _, c := range cfg.Concurrency {
		maxC = max(maxC, c)
	}
	if b.db, err = s.gorm(2*maxC + 4); err != nil {
		return nil, err
	}
	if err := outbox.Migrate(ctx, b.db); err != nil {
		return nil, err
	}
	if err := inbox.Migrate(ctx, b.db); err != nil {
		return nil, err
	}
	if err := b.db.WithContext(ctx).Exec("CREATE TABLE " + receiptsTable +
		" (event_id text PRIMARY KEY, account_id text NOT NULL, amount bigint NOT NULL)").Error; err != nil {
		return nil, err
	}
	b.msgs, err = consumeMessages(cfg.Messages)
	return b, err
}

// consumeMessages builds n events in bento's wire format, as the
// projector publishes them: ten deposits each to n/10 accounts.
func consumeMessages(n int) ([]messaging.Outgoing, error) {
	out := make([]messaging.Outgoing, n)
	now := time.Now().UTC()
	for i := range out {
		a := &Account{}
		a.ID = fmt.Sprintf("cons-%06d", i/10)
		payload, err := json.Marshal(a.deposited(int64(i+1), aggregate.NewID()))
		if err != nil {
			return nil, err
		}
		m, err := messaging.NewMessage(&outbox.Message{
			ID: aggregate.NewID(), TenantID: "default", Topic: topic, AggregateType: "account",
			AggregateID: a.ID, AggregateVersion: int64(i%10 + 1), SchemaVersion: 1,
			Payload: payload, OccurredAt: now, CreatedAt: now,
		})
		if err != nil {
			return nil, err
		}
		out[i] = messaging.Outgoing{Topic: topic, Message: m}
	}
	return out, nil
}

func (b *consumeBed) close() {
	if b.db != nil {
		closeGorm(b.db)
	}
	if err := b.schema.drop(); err != nil {
		b.e.log.Warn("cleanup", "err", err)
	}
}

// fill declares group's queue and publishes every message to it with
// confirms, then waits until the queue holds them all.
func (b *consumeBed) fill(ctx context.Context, cfg *rabbitmq.Config, group string) error {
	if err := rabbitmq.DeclareQueue(ctx, cfg, group, topic); err != nil {
		return err
	}
	if err := b.publishAll(ctx, cfg); err != nil {
		return err
	}
	_, err := b.e.waitDepth(ctx, group, len(b.msgs), time.Minute)
	return err
}

// publishAll publishes every message with confirms.
func (b *consumeBed) publishAll(ctx context.Context, cfg *rabbitmq.Config) error {
	pub, err := rabbitmq.NewConfirmPublisher(ctx, cfg)
	if err != nil {
		return err
	}
	defer pub.Close()
	const batch = 500
	for lo := 0; lo < len(b.msgs); lo += batch {
		if err := errors.Join(pub.PublishBatch(ctx, b.msgs[lo:min(lo+batch, len(b.msgs))])...); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	return nil
}

// fillPartitions declares n partitions of group (the batched mode's
// topology) and publishes every message, then waits until the partition
// queues hold them all.
func (b *consumeBed) fillPartitions(ctx context.Context, cfg *rabbitmq.Config, group string, n int) error {
	spec := consumer.PartitionSpec(cfg.Exchange, &consumer.Config{Group: group, Partitions: n})
	spec.Patterns = []string{topic}
	if err := rabbitmq.DeclarePartitions(ctx, cfg, spec); err != nil {
		return err
	}
	if err := b.publishAll(ctx, cfg); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		total := 0
		for p := range n {
			d, err := b.e.waitDepth(ctx, messaging.PartitionQueue(group, p), 0, time.Second)
			if err != nil {
				return err
			}
			total += d
		}
		if total >= len(b.msgs) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the partitions of %s hold %d messages, want %d", group, total, len(b.msgs))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runConsume measures one handler in one mode with n competing consumers
// of one group draining the pre-filled queue.
func runConsume(ctx context.Context, b *consumeBed, handler, mode string, n int) (r consumeRun, err error) {
	r = consumeRun{Handler: handler, Mode: mode, Consumers: n, Messages: len(b.msgs)}
	if mode == "direct" {
		r.Messages = min(len(b.msgs), directMax)
	}
	for _, q := range []string{"TRUNCATE inbox_messages", "TRUNCATE " + receiptsTable, "CHECKPOINT"} {
		if err := b.db.WithContext(ctx).Exec(q).Error; err != nil {
			return r, err
		}
	}
	names := newAMQPNames()
	group := names.Queue
	defer func() {
		for _, n := range []amqpNames{names, {Exchange: names.Exchange + ".dead", Queue: group + ".dead"}} {
			if err := b.e.deleteTopology(n); err != nil {
				b.e.log.Warn("cleanup", "err", err)
			}
		}
	}()
	c := newCounter(r.Messages)
	timer := &stmtTimer{}
	db := b.db.Session(&gorm.Session{Logger: timer})
	defer func() {
		r.InboxInsert, r.Write = timer.summary("INSERT INTO inbox_messages"), timer.summary("INSERT INTO "+receiptsTable)
	}()
	fn := handlerFunc(handler, c)
	if mode == "direct" {
		if err := runDirect(ctx, b, db, group, n, fn, c); err != nil {
			return r, err
		}
		r.Seconds, r.Rate = c.rate()
		return r, b.check(ctx, handler, mode, group, r.Messages)
	}
	if mode == "dbbus" {
		if r.Idle, err = runDatabaseBus(ctx, b, timer, group, n, fn, c); err != nil {
			return r, err
		}
		r.Seconds, r.Rate = c.rate()
		return r, b.check(ctx, handler, mode, group, r.Messages)
	}
	if mode == "wmsql" {
		var stalled *peerStallError
		err := runWatermillSQL(ctx, b, db, group, n, fn, c)
		if errors.As(err, &stalled) {
			r.Stalled = stalled.stall
			return r, nil
		}
		if err != nil {
			return r, err
		}
		r.Seconds, r.Rate = c.rate()
		return r, b.check(ctx, handler, mode, group, r.Messages)
	}
	cfg := &rabbitmq.Config{URL: b.e.amqpURL, Exchange: names.Exchange, Logger: b.e.log}
	if mode == "batched" {
		if err := b.fillPartitions(ctx, cfg, group, n); err != nil {
			return r, err
		}
		defer b.e.deletePartitions(names.Exchange, group, n)
	} else if err := b.fill(ctx, cfg, group); err != nil {
		return r, err
	}

	if mode == "bare" {
		if err := runBareConsume(ctx, b, group, handler, n, c); err != nil {
			return r, err
		}
		r.Seconds, r.Rate = c.rate()
		return r, b.check(ctx, handler, mode, group, r.Messages)
	}

	var runs []func(context.Context) error
	switch mode {
	case "inbox":
		cc := consumer.DefaultConfig(group)
		cc.CloseTimeout, cc.Logger, cc.Subscriptions = 10*time.Second, b.e.log, n
		// n competing subscriptions on the group's one queue, as measured
		// before partitions existed, so the figures stay comparable.
		cc.Partitions, cc.BatchSize = -1, 0
		cons, err := consumer.NewAMQP(ctx, db, cfg, cc)
		if err != nil {
			return r, err
		}
		if err := consumer.Handle(cons, fn); err != nil {
			return r, err
		}
		runs = append(runs, cons.Run)
	case "batched":
		cc := consumer.DefaultConfig(group)
		cc.CloseTimeout, cc.Logger = 10*time.Second, b.e.log
		cc.Partitions, cc.BatchSize = n, consumeBatchSize
		cons, err := consumer.NewAMQP(ctx, db, cfg, cc)
		if err != nil {
			return r, err
		}
		if err := consumer.Handle(cons, fn); err != nil {
			return r, err
		}
		runs = append(runs, cons.Run)
	case "plain":
		run, err := plainConsumer(ctx, cfg, db, group, n, b.e, fn)
		if err != nil {
			return r, err
		}
		runs = append(runs, run)
	default:
		return r, fmt.Errorf("unknown mode %q", mode)
	}
	var settle func() error
	if mode == "inbox" || mode == "batched" {
		settle = func() error { return b.waitInbox(ctx, group, len(b.msgs)) }
	}
	if err := runUntilCounted(ctx, c, runs, settle); err != nil {
		return r, err
	}
	r.Seconds, r.Rate = c.rate()
	return r, b.check(ctx, handler, mode, group, r.Messages)
}

// runUntilCounted runs each of runs until c has counted every message,
// then settle (when not nil) before it cancels them, and returns their
// errors and the wait's. It gives up after 10 minutes.
func runUntilCounted(ctx context.Context, c *counter, runs []func(context.Context) error, settle func() error) error {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, run := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(cctx); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	timeout := time.NewTimer(10 * time.Minute)
	defer timeout.Stop()
	var waitErr error
	select {
	case <-c.done:
	case <-timeout.C:
		waitErr = fmt.Errorf("handled %d of %d messages in 10 minutes", c.n.Load(), c.want)
	case <-ctx.Done():
		waitErr = ctx.Err()
	}
	if waitErr == nil && settle != nil {
		// The last handler has returned, but its transaction may still be
		// committing under the message's context: let it finish, or
		// cancelling now would roll it back.
		waitErr = settle()
	}
	cancel()
	wg.Wait()
	return errors.Join(append(errs, waitErr)...)
}

// runDirect calls the inbox middleware of group around the handler for
// each of the first c.want messages, from n goroutines, without a broker.
func runDirect(ctx context.Context, b *consumeBed, db *gorm.DB, group string, n int,
	fn consumer.HandlerFunc[Deposited], c *counter) error {
	in, err := inbox.New(db, &inbox.Config{Consumer: group, Logger: b.e.log})
	if err != nil {
		return err
	}
	dispatch, err := decodeDispatch(db, fn)
	if err != nil {
		return err
	}
	h := in.Middleware(func(msg *message.Message) ([]*message.Message, error) { return nil, dispatch(msg) })
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= int(c.want) || ctx.Err() != nil {
					return
				}
				m := b.msgs[i].Message.Copy()
				m.SetContext(ctx)
				if _, err := h(m); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// decodeDispatch returns what the inbox consumer does with a message
// before its handler: decode the wire format and the event, then call fn
// with the message's transaction, or db when it has none (without the
// inbox).
func decodeDispatch(db *gorm.DB, fn consumer.HandlerFunc[Deposited]) (func(*message.Message) error, error) {
	reg := messaging.NewRegistry()
	if err := messaging.Register[Deposited](reg); err != nil {
		return nil, err
	}
	return func(msg *message.Message) error {
		env, err := messaging.Decode(msg)
		if err != nil {
			return err
		}
		ev, err := reg.Decode(env)
		if err != nil {
			return err
		}
		d, ok := ev.(Deposited)
		if !ok {
			return fmt.Errorf("event %s decoded as %T", env.ID, ev)
		}
		return fn(msg.Context(), uow.DB(msg.Context(), db), d, env)
	}, nil
}

// waitInbox waits until the inbox of group holds want records.
func (b *consumeBed) waitInbox(ctx context.Context, group string, want int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := b.db.WithContext(ctx).Raw("SELECT count(*) FROM inbox_messages WHERE consumer = ?", group).Scan(&n).Error; err != nil {
			return err
		}
		if n >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("inbox holds %d records 30 s after the last handler returned, want %d", n, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// check verifies that every message took effect once: one inbox record
// each (inbox mode) and one receipt each ("write").
func (b *consumeBed) check(ctx context.Context, handler, mode, group string, want int) error {
	count := func(q string, args ...any) (int, error) {
		var n int
		err := b.db.WithContext(ctx).Raw(q, args...).Scan(&n).Error
		return n, err
	}
	if mode != "plain" && mode != "wmsql" {
		n, err := count("SELECT count(*) FROM inbox_messages WHERE consumer = ?", group)
		if err != nil {
			return err
		}
		if n != want {
			return fmt.Errorf("inbox holds %d records, want %d", n, want)
		}
	}
	if handler == "write" {
		n, err := count("SELECT count(*) FROM " + receiptsTable)
		if err != nil {
			return err
		}
		if n != want {
			return fmt.Errorf("%s holds %d rows, want %d", receiptsTable, n, want)
		}
	}
	return nil
}

// plainConsumer returns a Watermill router running fn for n competing
// subscriptions of group, each on its own bento AMQPSubscriber: the
// inbox consumer's decoding, retry and recoverer, without the inbox (and
// without the dead-letter middleware, which costs nothing until a message
// fails).
func plainConsumer(ctx context.Context, cfg *rabbitmq.Config, db *gorm.DB, group string, n int, e *env,
	fn consumer.HandlerFunc[Deposited]) (func(context.Context) error, error) {
	dispatch, err := decodeDispatch(db, fn)
	if err != nil {
		return nil, err
	}
	wlog := watermill.NewSlogLogger(e.log)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wlog)
	if err != nil {
		return nil, err
	}
	retry := middleware.Retry{MaxRetries: 5, InitialInterval: 100 * time.Millisecond, MaxInterval: 10 * time.Second,
		Multiplier: 2, RandomizationFactor: 0.5, ResetContextOnRetry: true, Logger: wlog}
	router.AddMiddleware(retry.Middleware, middleware.Recoverer)
	var subs []*rabbitmq.Subscriber
	for i := range n {
		sub, err := rabbitmq.NewSubscriber(ctx, cfg, group, topic)
		if err != nil {
			for _, s := range subs {
				_ = s.Close()
			}
			return nil, err
		}
		subs = append(subs, sub)
		router.AddConsumerHandler(fmt.Sprintf("%s-%d", group, i), group, sub, dispatch)
	}
	return func(ctx context.Context) error {
		defer func() {
			for _, s := range subs {
				_ = s.Close()
			}
		}()
		return router.Run(ctx)
	}, nil
}

// consumeResult is one run of the consumer scenario.
type consumeResult []consumeRun

// runConsumeScenario runs every handler, mode and consumer count once, in
// a fresh schema.
func runConsumeScenario(ctx context.Context, e *env, cfg consumeConfig, report func(string)) (consumeResult, error) {
	b, err := newConsumeBed(ctx, e, cfg)
	if err != nil {
		return nil, err
	}
	defer b.close()
	var out consumeResult
	for _, h := range cfg.Handlers {
		for _, n := range cfg.Concurrency {
			for _, mode := range cfg.Modes {
				r, err := runConsume(ctx, b, h, mode, n)
				if err != nil {
					return out, fmt.Errorf("%s: %w", consumeKey(mode, h, n), err)
				}
				extra := ""
				if l := r.InboxInsert; l != nil {
					extra += fmt.Sprintf("; inbox INSERT p50 %.2f ms", l.P50)
				}
				if l := r.Write; l != nil {
					extra += fmt.Sprintf("; handler INSERT p50 %.2f ms", l.P50)
				}
				if r.Stalled != nil {
					report(fmt.Sprintf("%-18s %6s messages: %s", consumeKey(mode, h, n), thousands(float64(r.Messages)), r.Stalled))
				} else {
					report(fmt.Sprintf("%-18s %6s messages in %6.2f s: %8s msg/s%s", consumeKey(mode, h, n),
						thousands(float64(r.Messages)), r.Seconds, thousands(r.Rate), extra))
				}
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// stmtTimer is a GORM logger that keeps each statement's duration by the
// start of its text. GORM formats each statement's text for it, a cost
// every mode that writes pays alike.
type stmtTimer struct {
	mu sync.Mutex
	ds map[string][]time.Duration
}

// LogMode implements logger.Interface.
func (t *stmtTimer) LogMode(logger.LogLevel) logger.Interface { return t }

// Info implements logger.Interface.
func (*stmtTimer) Info(context.Context, string, ...any) {}

// Warn implements logger.Interface.
func (*stmtTimer) Warn(context.Context, string, ...any) {}

// Error implements logger.Interface.
func (*stmtTimer) Error(context.Context, string, ...any) {}

// Trace implements logger.Interface: it keeps the statement's duration.
func (t *stmtTimer) Trace(_ context.Context, begin time.Time, fc func() (string, int64), _ error) {
	d := time.Since(begin)
	q, _ := fc()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ds == nil {
		t.ds = map[string][]time.Duration{}
	}
	// The text holds the values; its start names the statement.
	key := q[:min(len(q), 40)]
	t.ds[key] = append(t.ds[key], d)
}

// summary summarizes the statements starting with prefix, or nil for none.
func (t *stmtTimer) summary(prefix string) *latencies {
	t.mu.Lock()
	defer t.mu.Unlock()
	var all []time.Duration
	for q, ds := range t.ds {
		if strings.HasPrefix(q, prefix) {
			all = append(all, ds...)
		}
	}
	if len(all) == 0 {
		return nil
	}
	l := summarize(all)
	return &l
}
