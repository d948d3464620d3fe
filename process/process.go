package process

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/dberr"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

var (
	// ErrInvalidConfig is returned by New for a bad configuration.
	ErrInvalidConfig = errors.New("process: invalid config")
	// ErrNoKey is returned (as a permanent failure of the message) when a
	// key function gives an empty correlation key.
	ErrNoKey = errors.New("process: message has no correlation key")
	// ErrConflict is returned (as a transient failure, so the consumer
	// retries the message in place) when another step of the same process
	// committed first: a concurrent start, or a step that changed the
	// state since this one read it.
	ErrConflict = errors.New("process: concurrent step of the same process")
	// ErrNotFound is the failure a message of a Handles step with
	// OnMissing(Fail) reports when its process has not started.
	ErrNotFound = errors.New("process: no such process")
)

// Metadata keys a timeout message carries, so that its arrival finds its
// process and can tell a live timeout from a stale one.
const (
	MetaProcess = "bento_process"
	MetaKey     = "bento_process_key"
	MetaTimeout = "bento_process_timeout"
)

// Base is embedded in a process's state model: the process's identity
// (tenant and correlation key, the primary key), its version for
// optimistic concurrency, whether it completed, and its live timeouts.
type Base struct {
	TenantID string `gorm:"primaryKey;size:32"`
	Key      string `gorm:"column:process_key;primaryKey;size:255"`
	// Process is the process type's Config.Name, set when it starts.
	Process string `gorm:"size:64"`
	// Version counts the steps committed; a step commits only if it is
	// still the version the step read.
	Version int64
	// Completed is set by Step.Complete: the row stays as a tombstone, so
	// that late messages neither restart the process nor fail.
	Completed   bool
	CompletedAt *time.Time
	StartedAt   time.Time
	UpdatedAt   time.Time `gorm:"autoUpdateTime:false"`
	// Timeouts maps each live timeout's name to the id of its scheduled
	// message: its token. A timeout that arrives with another id was
	// cancelled or replaced, and is dropped.
	Timeouts Timeouts `gorm:"type:text"`
}

// ProcessBase returns b; it makes a model that embeds Base a State.
func (b *Base) ProcessBase() *Base { return b }

// State is implemented by a pointer to a process's state model, through
// its embedded Base.
type State interface{ ProcessBase() *Base }

// Timeouts maps a timeout's name to its token (see Base.Timeouts). It is
// stored as JSON text.
type Timeouts map[string]string

// Value implements driver.Valuer.
func (t Timeouts) Value() (driver.Value, error) {
	if len(t) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(map[string]string(t))
	return string(b), err
}

// Scan implements sql.Scanner.
func (t *Timeouts) Scan(v any) error {
	var b []byte
	switch x := v.(type) {
	case nil:
		*t = nil
		return nil
	case string:
		b = []byte(x)
	case []byte:
		b = x
	default:
		return fmt.Errorf("process: timeouts stored as %T", v)
	}
	m := map[string]string{}
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("process: timeouts: %w", err)
	}
	*t = m
	return nil
}

// Config configures a Manager.
type Config struct {
	// Name names the process type: it prefixes the keys of its timeouts
	// and appears in logs. Required: letters, digits, '.', '_' or '-'.
	Name string
	// Outbox is the store the steps emit and schedule with. Required.
	Outbox *outbox.Store
	// Logger gets a line for each message dropped by a policy. Defaults
	// to none.
	Logger *slog.Logger
}

// Manager runs one process type, whose state model is S, on a consumer:
// the steps registered with StartedBy, Handles and OnTimeout run in the
// consumer's inbox transaction of each message, so a step's state change,
// the messages it emits and the timeouts it schedules or cancels commit
// exactly once with the message's inbox record, or not at all.
type Manager[S any, P interface {
	*S
	State
}] struct {
	cfg Config
	c   *consumer.Consumer
	log *slog.Logger
}

// New returns a manager of process type S on c. Partition c's group by the
// processes' correlation key (a partitioned consumer whose messages'
// partition key is the process's key: the events of the aggregate the key
// names, and the timeouts, which go where the message that scheduled them
// went), so that one process's steps run one at a time; a step that
// races another of its process anyway fails with ErrConflict and is
// retried.
//
// Errors: ErrInvalidConfig.
func New[S any, P interface {
	*S
	State
}](c *consumer.Consumer, cfg Config) (*Manager[S, P], error) {
	var errs []error
	if c == nil {
		errs = append(errs, errors.New("nil consumer"))
	}
	if cfg.Outbox == nil {
		errs = append(errs, errors.New("Outbox is required"))
	}
	if !validName(cfg.Name) {
		errs = append(errs, fmt.Errorf("Name %q must be 1-64 letters, digits, '.', '_' or '-'", cfg.Name))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Manager[S, P]{cfg: cfg, c: c, log: log.With("process", cfg.Name)}, nil
}

func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		if !ok {
			return false
		}
	}
	return true
}

// StepFunc is one step of a process: it reads and changes the state in
// s.State and may emit, schedule, cancel and complete through s.
type StepFunc[S any, E aggregate.Event] func(ctx context.Context, s *Step[S], e E) error

// Missing is what a Handles step does with a message whose process has
// not started.
type Missing int

const (
	// Ignore drops the message, with a log line. The default.
	Ignore Missing = iota
	// Fail fails the message with ErrNotFound, so the consumer retries it
	// and, once its retries are spent, dead-letters it: for a message that
	// may arrive before the one that starts its process.
	Fail
)

// StartedBy registers step for messages of type E, which start the process
// whose key is key(e), or continue it if it is running: s.New reports
// which. A message for a completed process is dropped, with a log line.
//
// Errors: those of consumer.Handle.
func StartedBy[E aggregate.Event, S any, P interface {
	*S
	State
}](m *Manager[S, P], key func(E) string, step StepFunc[S, E]) error {
	return consumer.Handle(m.c, func(ctx context.Context, tx *gorm.DB, e E, env *messaging.Envelope) error {
		return m.run(ctx, tx, env, key(e), "", true, Ignore, func(s *Step[S]) error { return step(ctx, s, e) })
	})
}

// Handles registers step for messages of type E, which continue the
// running process whose key is key(e). A message for a completed process
// is dropped, with a log line; one for a process that has not started
// follows missing.
//
// Errors: those of consumer.Handle.
func Handles[E aggregate.Event, S any, P interface {
	*S
	State
}](m *Manager[S, P], key func(E) string, missing Missing, step StepFunc[S, E]) error {
	return consumer.Handle(m.c, func(ctx context.Context, tx *gorm.DB, e E, env *messaging.Envelope) error {
		return m.run(ctx, tx, env, key(e), "", false, missing, func(s *Step[S]) error { return step(ctx, s, e) })
	})
}

// OnTimeout registers step for the timeout messages of type E that steps
// schedule with Step.Schedule. The message finds its process by the key it
// carries. It runs the step only if it is still the process's live
// timeout of its name; a timeout that was cancelled or replaced after its
// message was released, or whose process completed, is dropped with a log
// line.
//
// Errors: those of consumer.Handle.
func OnTimeout[E aggregate.Event, S any, P interface {
	*S
	State
}](m *Manager[S, P], step StepFunc[S, E]) error {
	return consumer.Handle(m.c, func(ctx context.Context, tx *gorm.DB, e E, env *messaging.Envelope) error {
		name := env.Metadata[MetaTimeout]
		if env.Metadata[MetaProcess] != m.cfg.Name || name == "" {
			return consumer.Permanent(fmt.Errorf("process %s: %s %s is not a timeout of this process type", m.cfg.Name, env.EventType, env.ID))
		}
		return m.run(ctx, tx, env, env.Metadata[MetaKey], name, false, Ignore, func(s *Step[S]) error { return step(ctx, s, e) })
	})
}

// run loads the process, runs fn as a step of it and saves it.
func (m *Manager[S, P]) run(ctx context.Context, tx *gorm.DB, env *messaging.Envelope, key, timeout string,
	starts bool, missing Missing, fn func(s *Step[S]) error) error {
	if key == "" {
		return consumer.Permanent(fmt.Errorf("%w: %s %s (process %s)", ErrNoKey, env.EventType, env.ID, m.cfg.Name))
	}
	log := m.log.With("key", key, "tenant", env.TenantID, "event_type", env.EventType, "event_id", env.ID)
	state := new(S)
	err := tx.Where("tenant_id = ? AND process_key = ?", env.TenantID, key).Take(state).Error
	found := err == nil
	switch {
	case errors.Is(err, gorm.ErrRecordNotFound):
	case err != nil:
		return fmt.Errorf("process %s: load %s: %w", m.cfg.Name, key, err)
	}
	base := P(state).ProcessBase()
	switch {
	case found && base.Completed:
		log.Info("message for a completed process dropped")
		return nil
	case !found && !starts && missing == Fail:
		return fmt.Errorf("%w: %s %s of tenant %s (process %s)", ErrNotFound, env.EventType, key, env.TenantID, m.cfg.Name)
	case !found && !starts:
		log.Info("message for a process that has not started dropped")
		return nil
	case timeout != "" && base.Timeouts[timeout] != env.ID:
		log.Info("stale timeout dropped: cancelled or replaced", "timeout", timeout)
		return nil
	}
	now := m.cfg.Outbox.Config().Clock.Now().UTC()
	if !found {
		base.TenantID, base.Key, base.Process, base.StartedAt = env.TenantID, key, m.cfg.Name, now
	}
	if timeout != "" {
		delete(base.Timeouts, timeout) // it fired
	}
	s := &Step[S]{State: state, Tx: tx, Message: env, m: m.cfg, base: base, new: !found}
	if err := fn(s); err != nil {
		return err
	}
	read := base.Version
	base.Version++
	base.UpdatedAt = now
	if s.complete && !base.Completed {
		base.Completed, base.CompletedAt = true, &now
	}
	if !found {
		if err := tx.Create(state).Error; err != nil {
			if dberr.IsUniqueViolation(err) {
				return consumer.Transient(fmt.Errorf("%w: %s started twice at once", ErrConflict, key))
			}
			return fmt.Errorf("process %s: start %s: %w", m.cfg.Name, key, err)
		}
		return nil
	}
	res := tx.Model(state).Where("version = ?", read).Select("*").Updates(state)
	if res.Error != nil {
		return fmt.Errorf("process %s: save %s: %w", m.cfg.Name, key, res.Error)
	}
	if res.RowsAffected != 1 {
		return consumer.Transient(fmt.Errorf("%w: %s changed since version %d", ErrConflict, key, read))
	}
	return nil
}

// Step is what a step function works with: the process's state, the
// message's transaction and envelope, and the calls that emit, schedule
// and complete. Everything a step does commits with its message's inbox
// record.
type Step[S any] struct {
	// State is the process's state: change it in place.
	State *S
	// Tx is the message's inbox transaction, for writes of your own.
	Tx *gorm.DB
	// Message is the envelope of the message the step handles.
	Message *messaging.Envelope

	m        Config
	base     *Base
	new      bool
	complete bool
}

// New reports whether this step started the process.
func (s *Step[S]) New() bool { return s.new }

// Complete marks the process completed when the step commits: it keeps
// its row, and later messages for it are dropped. Its timeouts still
// scheduled are dropped on arrival; cancel them to spare the relay.
func (s *Step[S]) Complete() { s.complete = true }

// Emit writes e to the outbox in the step's transaction, as an event of no
// aggregate (outbox.Store.Add), correlated with the step's message.
func (s *Step[S]) Emit(ctx context.Context, e aggregate.Event) error {
	_, err := s.m.Outbox.Add(ctx, s.Tx, e.EventType(), e, &outbox.AddOpts{Tenant: s.base.TenantID})
	if err != nil {
		return fmt.Errorf("process %s: emit %s: %w", s.m.Name, e.EventType(), err)
	}
	return nil
}

// Schedule schedules e as the process's timeout called name, due when due
// says, in the step's transaction. A live timeout of the same name is
// cancelled and replaced. The timeout goes to the consumer partition of
// the step's message, and is handled by the OnTimeout step of its type.
func (s *Step[S]) Schedule(ctx context.Context, name string, e aggregate.Event, due outbox.Due) error {
	if err := s.CancelTimeout(ctx, name); err != nil {
		return err
	}
	msg, err := s.m.Outbox.Schedule(ctx, s.Tx, e.EventType(), e, due, &outbox.ScheduleOpts{
		Tenant:       s.base.TenantID,
		Key:          s.timeoutKey(name),
		PartitionKey: s.Message.Metadata[messaging.MetaPartitionKey],
		Metadata:     outbox.Metadata{MetaProcess: s.m.Name, MetaKey: s.base.Key, MetaTimeout: name},
	})
	if err != nil {
		return fmt.Errorf("process %s: schedule %s: %w", s.m.Name, name, err)
	}
	if s.base.Timeouts == nil {
		s.base.Timeouts = Timeouts{}
	}
	s.base.Timeouts[name] = msg.ID
	return nil
}

// CancelTimeout cancels the process's timeout called name, if it is live.
// A timeout whose message was already released still arrives, and is then
// dropped: once the step commits it is no longer the live one.
func (s *Step[S]) CancelTimeout(ctx context.Context, name string) error {
	if _, live := s.base.Timeouts[name]; !live {
		return nil
	}
	delete(s.base.Timeouts, name)
	_, err := s.m.Outbox.Cancel(ctx, s.Tx, s.timeoutKey(name), &outbox.CancelOpts{Tenant: s.base.TenantID})
	if err != nil && !errors.Is(err, outbox.ErrCancelTooLate) && !errors.Is(err, outbox.ErrNotScheduled) {
		return fmt.Errorf("process %s: cancel %s: %w", s.m.Name, name, err)
	}
	return nil
}

// Deadline returns when the process's live timeout called name falls due,
// and whether it is live.
func (s *Step[S]) Deadline(ctx context.Context, name string) (time.Time, bool, error) {
	return Deadline(ctx, s.m.Outbox, s.base, s.m.Name, name)
}

// timeoutKey is the schedule key of the process's timeout called name.
func (s *Step[S]) timeoutKey(name string) string { return timeoutKey(s.m.Name, s.base.Key, name) }

func timeoutKey(process, key, name string) string { return process + "/" + key + "/" + name }

// Deadline returns when the live timeout called name of the process with
// base b, of process type process, falls due, and whether it is live and
// still waiting: for a read model or an API that shows the deadline.
//
// Errors: those of outbox.Store.ListScheduled.
func Deadline(ctx context.Context, store *outbox.Store, b *Base, process, name string) (time.Time, bool, error) {
	id, live := b.Timeouts[name]
	if !live {
		return time.Time{}, false, nil
	}
	got, err := store.ListScheduled(ctx, outbox.ScheduledFilter{Tenant: b.TenantID, Key: timeoutKey(process, b.Key, name), Limit: 10})
	if err != nil {
		return time.Time{}, false, err
	}
	for _, m := range got {
		if m.ID == id {
			return m.DueAt, true, nil
		}
	}
	return time.Time{}, false, nil
}
