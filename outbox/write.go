package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dberr"
	"github.com/bentoevents/bento/internal/wire"
	"github.com/bentoevents/bento/tenant"
)

// insertBatchSize is the most rows one INSERT statement carries.
const insertBatchSize = 500

// AddOpts are the optional fields of [Store.Add]. A nil *AddOpts means none.
type AddOpts struct {
	// Tenant is the event's tenant. Defaults to the tenant in ctx
	// (tenant.With), then tenant.Default.
	Tenant string
	// DedupKey, when set, must be unique among the tenant's events: a second
	// Add with the same key returns ErrDuplicateKey and writes nothing.
	DedupKey string
	// AggregateType, AggregateID and AggregateVersion describe the aggregate
	// the event belongs to, if any. Events of one aggregate are relayed in
	// version order: an event with an aggregate needs a version of at least
	// 1, and a tenant's (aggregate type, id, version) can be written only
	// once (ErrDuplicateVersion). Without an aggregate the version must be
	// 0.
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	// SchemaVersion is the payload's schema version. Defaults to 1.
	SchemaVersion int
	// Metadata is merged over the metadata in ctx (WithMetadata).
	Metadata Metadata
	// OccurredAt is when the event happened. Defaults to now.
	OccurredAt time.Time
}

// Add is the manual mode: it writes one event with topic and payload into the
// outbox within tx, the caller's transaction, so the event commits or rolls
// back with the caller's own changes. payload is encoded as with
// [EncodePayload]. Add returns the stored row, whose ID is the event id.
//
// Errors: a *ValidationError wrapping ErrInvalidEvent, ErrPayloadTooLarge,
// ErrMetadataTooLarge or tenant.ErrInvalid; ErrDuplicateKey; ErrDuplicateVersion; ErrClosed; or the
// database error. Nothing is written when Add returns an error.
func (s *Store) Add(ctx context.Context, tx *gorm.DB, topic string, payload any, opts *AddOpts) (*Message, error) {
	if opts == nil {
		opts = &AddOpts{}
	}
	body, err := EncodePayload(payload)
	if err != nil {
		return nil, &ValidationError{Topic: topic, Field: "payload", Reason: "cannot be encoded as JSON", Err: err}
	}
	tid, err := tenant.Resolve(ctx, opts.Tenant, "")
	if err != nil {
		return nil, &ValidationError{Topic: topic, Field: "tenant_id", Reason: "is invalid", Err: err}
	}
	m := &Message{
		TenantID:         tid,
		Topic:            topic,
		AggregateType:    opts.AggregateType,
		AggregateID:      opts.AggregateID,
		AggregateVersion: opts.AggregateVersion,
		SchemaVersion:    opts.SchemaVersion,
		Payload:          body,
		Metadata:         opts.Metadata,
		OccurredAt:       opts.OccurredAt,
	}
	if opts.DedupKey != "" {
		k := opts.DedupKey
		m.DedupKey = &k
	}
	m.Metadata = s.traceInto(ctx, m.Metadata)
	if err := s.Insert(ctx, tx, []*Message{m}); err != nil {
		return nil, err
	}
	return m, nil
}

// Prepare fills in what is unset in msgs and validates them, without writing:
// ID (a new id from the Clock), TenantID (tenant in ctx, then
// tenant.Default), SchemaVersion 1, OccurredAt and CreatedAt (the Clock's
// now), Status new, SizeBytes, and the metadata
// carried by ctx. An unset AvailableAt stays zero: Insert makes the row due
// at the database's current time. [Store.Insert] calls it; a unit of work calls it before saving
// anything, so a bad event stops the commit before the first write.
//
// Errors: a *ValidationError, ErrDuplicateKey for a dedup key used twice in
// msgs, or ErrDuplicateVersion for an aggregate version used twice in msgs.
func (s *Store) Prepare(ctx context.Context, msgs []*Message) error {
	now := s.cfg.Clock.Now().UTC()
	ctxMeta := MetadataFrom(ctx)
	keys := map[[2]string]bool{}
	versions := map[aggregateVersion]bool{}
	for _, m := range msgs {
		if m.ID == "" {
			m.ID = s.cfg.Clock.NewID(now)
		}
		if m.TenantID == "" {
			tid, err := tenant.Resolve(ctx, "", "")
			if err != nil {
				return &ValidationError{EventID: m.ID, Topic: m.Topic, Field: "tenant_id", Reason: "is invalid", Err: err}
			}
			m.TenantID = tid
		}
		if m.SchemaVersion == 0 {
			m.SchemaVersion = 1
		}
		if m.OccurredAt.IsZero() {
			m.OccurredAt = now
		}
		m.OccurredAt = m.OccurredAt.UTC()
		m.CreatedAt = now
		if !m.AvailableAt.IsZero() {
			m.AvailableAt = m.AvailableAt.UTC()
		}
		if m.Status == "" {
			m.Status = StatusNew
		}
		if len(ctxMeta) > 0 {
			md := Metadata{}
			for k, v := range ctxMeta {
				md[k] = v
			}
			for k, v := range m.Metadata {
				md[k] = v
			}
			m.Metadata = md
		}
		if err := s.validate(m); err != nil {
			return err
		}
		m.SizeBytes = m.size()
		if m.AggregateID != "" {
			k := aggregateVersion{m.TenantID, m.AggregateType, m.AggregateID, m.AggregateVersion}
			if versions[k] {
				return fmt.Errorf("%w: %s %s version %d twice in one batch (tenant %s)",
					ErrDuplicateVersion, m.AggregateType, m.AggregateID, m.AggregateVersion, m.TenantID)
			}
			versions[k] = true
		}
		if m.DedupKey != nil {
			k := [2]string{m.TenantID, *m.DedupKey}
			if keys[k] {
				return fmt.Errorf("%w: key %q used twice in one batch (tenant %s)", ErrDuplicateKey, *m.DedupKey, m.TenantID)
			}
			keys[k] = true
		}
	}
	for _, m := range msgs {
		m.prepared = true
	}
	return nil
}

// aggregateVersion identifies one event of an aggregate.
type aggregateVersion struct {
	tenant, typ, id string
	version         int64
}

func allPrepared(msgs []*Message) bool {
	for _, m := range msgs {
		if !m.prepared {
			return false
		}
	}
	return true
}

// Insert prepares msgs (see [Store.Prepare]; skipped for messages Prepare
// already accepted) and writes them within tx, the caller's transaction, in
// one statement per 500 rows. Every message is validated before anything is
// written.
//
// Errors are those of [Store.Add]. When Insert returns ErrDuplicateKey or
// ErrDuplicateVersion other messages of the batch may have been written:
// roll tx back.
func (s *Store) Insert(ctx context.Context, tx *gorm.DB, msgs []*Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if tx == nil {
		return errors.New("outbox: insert: nil transaction")
	}
	if !allPrepared(msgs) {
		if err := s.Prepare(ctx, msgs); err != nil {
			return err
		}
	}
	hasDedup := false
	for _, m := range msgs {
		if m.DedupKey != nil {
			hasDedup = true
		}
	}
	onConflict := ""
	if hasDedup {
		partitioned, err := s.isPartitioned(ctx, tx)
		if err != nil {
			return err
		}
		// A partitioned table has no unique index on the dedup key for ON
		// CONFLICT to name: its insert trigger skips a row whose key is
		// taken, which counts the same below.
		if !partitioned {
			onConflict = insertOnConflict
		}
	}
	// Batches keep each statement under the bind-parameter limits
	// (65,535 on PostgreSQL, 32,766 on SQLite) however many events a unit
	// writes.
	var written int64
	for start := 0; start < len(msgs); start += insertBatchSize {
		batch := msgs[start:min(start+insertBatchSize, len(msgs))]
		res := tx.WithContext(ctx).Exec(insertSQL(len(batch))+onConflict, insertArgs(batch, s.clock.now())...)
		if res.Error != nil {
			if dberr.IsUniqueViolationOf(res.Error, versionConstraint, versionColumns) {
				return fmt.Errorf("outbox: insert: %w: %w", ErrDuplicateVersion, res.Error)
			}
			return wrapDB("outbox: insert", res.Error)
		}
		written += res.RowsAffected
	}
	if written != int64(len(msgs)) {
		return fmt.Errorf("%w: %d of %d events not written because their dedup key is taken",
			ErrDuplicateKey, int64(len(msgs))-written, len(msgs))
	}
	return nil
}

// or the metadata ctx carries (WithMetadata) already has a traceparent: the
// caller's choice is kept. Without a valid span md is returned as it is.
func (s *Store) traceInto(ctx context.Context, md Metadata) Metadata {
	if _, set := md[wire.Traceparent]; set {
		return md
	}
	if _, set := MetadataFrom(ctx)[wire.Traceparent]; set {
		return md
	}
	tc := s.tracing.Inject(ctx, nil)
	if len(tc) == 0 {
		return md
	}
	out := maps.Clone(md)
	if out == nil {
		out = Metadata{}
	}
	maps.Copy(out, tc)
	return out
}
