package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/migrate"
	"github.com/bentoevents/bento/tenant"
)

// Ledger remembers the requests made with an Idempotency-Key and their
// responses, in the idempotency_keys table; [Ledger.Middleware] puts it in
// front of a handler. It is safe for concurrent use.
type Ledger struct {
	db      *gorm.DB
	dialect dialect.Dialect
	cfg     Config
	lockMS  int64
	log     *slog.Logger
}

// New returns a ledger over db, a PostgreSQL or SQLite *gorm.DB with the
// ledger's table created by Migrate, and cfg, which must name the callers
// (Config.Caller or Config.SingleCaller; its other zero fields mean their
// defaults). On SQLite, open db with embedded.OpenSQLite, whose
// transactions begin IMMEDIATE; see the package documentation. It checks that the table exists, with one
// query under db's context.
//
// Errors: ErrInvalidConfig, naming each bad field, and with it ErrNoCaller
// when cfg sets neither Caller nor SingleCaller (a nil cfg included);
// ErrNotMigrated; or the database error of the check.
func New(db *gorm.DB, cfg *Config) (*Ledger, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	d, err := dialect.Of(db)
	errs := []error{c.validate()}
	if err != nil {
		errs = append(errs, fmt.Errorf("db: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := migrate.Require(db, component, ErrNotMigrated, Record{}.TableName()); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	ms := int64((c.LockTimeout + time.Millisecond - 1) / time.Millisecond)
	return &Ledger{
		db: db, dialect: d, cfg: c, lockMS: ms,
		log: c.Logger.With("component", "bento.idempotency"),
	}, nil
}

// Config returns the ledger's configuration, defaults filled in and
// StoredHeaders in canonical form.
func (l *Ledger) Config() Config {
	c := l.cfg
	c.StoredHeaders = slices.Clone(c.StoredHeaders)
	return c
}

// keyed is a request that carries a valid key.
type keyed struct {
	tenant string
	key    string
	digest string
	body   []byte
}

// maxAttempts bounds how often one request starts over after finding its
// key's row expired (or gone) at the insert.
const maxAttempts = 2

// Middleware returns next behind the ledger: requests with an
// Idempotency-Key run at most once per (tenant, key) within Config.TTL, and
// repeats get the first response back. Requests without the header go
// straight to next. The package documentation (# Semantics) describes the
// exact behaviour.
func (l *Ledger) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		values, present := r.Header[HeaderKey]
		if !present {
			next.ServeHTTP(w, r)
			return
		}
		if len(values) != 1 {
			problemInvalidKey(fmt.Errorf("%w: header sent %d times", ErrInvalidKey, len(values))).write(w)
			return
		}
		key := values[0]
		if err := ValidateKey(key); err != nil {
			problemInvalidKey(err).write(w)
			return
		}
		caller, err := l.caller(r)
		if err != nil {
			l.log.WarnContext(r.Context(), "caller unknown; refused", "key", key, "err", err)
			problemNoCaller.write(w)
			return
		}
		tid := l.cfg.Tenant(r)
		if tid == "" {
			tid = tenant.Default
		}
		if err := tenant.Validate(tid); err != nil {
			aboutBlank(http.StatusBadRequest, "invalid tenant: "+err.Error()).write(w)
			return
		}
		body, p := l.readBody(r)
		if p != nil {
			p.write(w)
			return
		}
		req := &keyed{tenant: tid, key: scopedKey(caller, key), body: body,
			digest: RequestDigest(r.Method, requestTarget(r.URL), body)}
		for attempt := 1; ; attempt++ {
			if !l.attempt(w, r, next, req) {
				return
			}
			if attempt == maxAttempts {
				// The key's row keeps expiring or vanishing under us:
				// someone else is busy with it.
				l.log.WarnContext(r.Context(), "key kept changing; refused", "tenant", tid, "key", key)
				problemInProgress.write(w)
				return
			}
		}
	})
}

// caller returns the request's caller: "" in single-caller mode, else
// what Config.Caller names, which must not be empty.
func (l *Ledger) caller(r *http.Request) (string, error) {
	if l.cfg.SingleCaller {
		return "", nil
	}
	c, err := l.cfg.Caller(r)
	if err == nil && c == "" {
		err = errors.New("Config.Caller returned an empty caller")
	}
	return c, err
}

// readBody reads the request body, up to MaxBodyBytes.
func (l *Ledger) readBody(r *http.Request) ([]byte, *problem) {
	limit := l.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		p := problemBodyTooLarge(limit)
		return nil, &p
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	var tooLarge *http.MaxBytesError
	switch {
	case int64(len(body)) > limit || errors.As(err, &tooLarge):
		p := problemBodyTooLarge(limit)
		return nil, &p
	case err != nil:
		p := aboutBlank(http.StatusBadRequest, "the request body could not be read")
		return nil, &p
	}
	return body, nil
}

// attempt handles req once. It returns true when the request must start
// over: its key's row was expired (and has been deleted) or disappeared.
func (l *Ledger) attempt(w http.ResponseWriter, r *http.Request, next http.Handler, req *keyed) (again bool) {
	ctx := r.Context()
	now := l.cfg.Clock.Now().UTC().Truncate(time.Microsecond)
	s, err := l.begin(ctx)
	if err != nil {
		if isLockTimeout(err) {
			l.inProgress(ctx, w, req)
			return false
		}
		l.notRecorded(w, r, req, "begin", err)
		return false
	}
	// Rolls back on every early return and when next panics (the panic goes
	// on after the rollback).
	defer s.rollback()

	res := s.tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&Record{
		TenantID: req.tenant, Key: req.key, RequestDigest: req.digest, State: StateInProgress,
		CreatedAt: now, ExpiresAt: now.Add(l.cfg.TTL),
	})
	if res.Error != nil {
		if isLockTimeout(res.Error) {
			l.inProgress(ctx, w, req)
			return false
		}
		l.notRecorded(w, r, req, "insert key", res.Error)
		return false
	}
	if res.RowsAffected == 0 {
		s.rollback()
		return l.existing(w, r, req, now)
	}
	if err := s.afterInsert(); err != nil {
		l.notRecorded(w, r, req, "insert key", err)
		return false
	}

	hctx := tenant.With(s.owned.Join(ctx), req.tenant)
	hr := r.WithContext(hctx)
	hr.Body = io.NopCloser(bytes.NewReader(req.body))
	hr.ContentLength = int64(len(req.body))
	hr.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(req.body)), nil }
	rec := newRecorder()
	next.ServeHTTP(rec, hr)
	resp := rec.result()

	if transient(resp.status) {
		s.rollback()
		l.log.DebugContext(ctx, "transient failure not stored; rolled back", "tenant", req.tenant, "key", req.key, "status", resp.status)
		resp.writeTo(w, nil)
		return false
	}
	if err := l.complete(s.tx, req, resp); err != nil {
		l.notRecorded(w, r, req, "store response", err)
		return false
	}
	if err := s.commit(); err != nil { // then the AfterCommit hooks of the handler's units
		l.notRecorded(w, r, req, "commit", err)
		return false
	}
	resp.writeTo(w, nil)
	return false
}

// transient reports whether status says the request may succeed if tried
// again: a timeout (408), a conflict such as a concurrent update (409), too
// early (425), too many requests (429) or a server error (5xx). Such a
// response is not stored, and the handler's work is rolled back, so a
// retry with the same key runs anew instead of getting it back for TTL.
func transient(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return status >= 500
}

// complete stores resp as the key's response.
func (l *Ledger) complete(tx *gorm.DB, req *keyed, resp response) error {
	stored := http.Header{}
	for _, k := range l.cfg.StoredHeaders {
		if v := resp.header[k]; len(v) > 0 {
			stored[k] = v
		}
	}
	headers, err := json.Marshal(stored)
	if err != nil {
		return err
	}
	body := resp.body
	if body == nil {
		body = []byte{}
	}
	res := tx.Model(&Record{}).
		Where("tenant_id = ? AND idem_key = ?", req.tenant, req.key).
		Updates(map[string]any{
			"state": StateCompleted, "status_code": resp.status, "headers": string(headers), "body": body,
		})
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected != 1 {
		return fmt.Errorf("updated %d rows, want 1", res.RowsAffected)
	}
	return nil
}

// existing answers a request whose key's row exists: replay, 409, or start
// over when the row has expired.
func (l *Ledger) existing(w http.ResponseWriter, r *http.Request, req *keyed, now time.Time) (again bool) {
	ctx := r.Context()
	var rows []Record
	err := l.db.WithContext(ctx).Where("tenant_id = ? AND idem_key = ?", req.tenant, req.key).Limit(1).Find(&rows).Error
	if err != nil {
		l.notRecorded(w, r, req, "read key", err)
		return false
	}
	if len(rows) == 0 {
		return true // purged since the insert conflicted
	}
	rec := rows[0]
	if !rec.ExpiresAt.After(now) {
		err := l.db.WithContext(ctx).
			Where("tenant_id = ? AND idem_key = ? AND expires_at <= ?", req.tenant, req.key, now).
			Delete(&Record{}).Error
		if err != nil {
			l.notRecorded(w, r, req, "delete expired key", err)
			return false
		}
		l.log.DebugContext(ctx, "expired key deleted; request runs anew", "tenant", req.tenant, "key", req.key)
		return true
	}
	if rec.RequestDigest != req.digest {
		l.log.InfoContext(ctx, "key reused with a different request; refused", "tenant", req.tenant, "key", req.key)
		problemKeyReused.write(w)
		return false
	}
	if rec.State != StateCompleted {
		l.inProgress(ctx, w, req) // not reachable by the ledger's own writes
		return false
	}
	l.log.DebugContext(ctx, "replayed", "tenant", req.tenant, "key", req.key, "status", rec.StatusCode)
	stored := response{status: rec.StatusCode, header: rec.Headers, body: rec.Body}
	stored.writeTo(w, http.Header{HeaderReplayed: {"true"}})
	return false
}

// inProgress answers 409: a request with the key is still running.
func (l *Ledger) inProgress(ctx context.Context, w http.ResponseWriter, req *keyed) {
	l.log.InfoContext(ctx, "key still in progress after LockTimeout; refused",
		"tenant", req.tenant, "key", req.key, "lock_timeout", l.cfg.LockTimeout)
	problemInProgress.write(w)
}

// notRecorded answers 500: the request had no effect.
func (l *Ledger) notRecorded(w http.ResponseWriter, r *http.Request, req *keyed, op string, err error) {
	err = wrapDB(op, err)
	if r.Context().Err() != nil {
		l.log.DebugContext(r.Context(), "request abandoned by the client", "tenant", req.tenant, "key", req.key, "err", err)
	} else {
		l.log.ErrorContext(r.Context(), "request not recorded", "tenant", req.tenant, "key", req.key, "err", err)
	}
	problemNotRecorded.write(w)
}
