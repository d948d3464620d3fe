package main

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/uow"
)

// claimConfig sizes the claim scenario.
type claimConfig struct {
	Pending   int `json:"pending_rows"`
	SentSmall int `json:"sent_rows_small"`
	SentLarge int `json:"sent_rows_large"`
	Claims    int `json:"claims"`
	Limit     int `json:"limit"`
}

// claimPoint is the claim cost beside one number of sent rows.
type claimPoint struct {
	SentRows int       `json:"sent_rows"`
	Claim    latencies `json:"claim"`
	Release  latencies `json:"release"`
	Indexes  []string  `json:"indexes"`
	Plan     string    `json:"plan"`
}

const claimWorker = "bench-claim"

// runClaim measures outbox.Store.Claim of cfg.Limit rows (each followed by
// Store.Release, so the backlog stays the same) with cfg.Pending unsent
// rows beside cfg.SentSmall, then cfg.SentLarge, sent rows.
func runClaim(ctx context.Context, e *env, cfg claimConfig) ([]claimPoint, error) {
	s, err := e.newSchema(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := s.drop(); err != nil {
			e.log.Warn("cleanup", "err", err)
		}
	}()
	db, err := s.gorm(4)
	if err != nil {
		return nil, err
	}
	defer closeGorm(db)
	if err := migrate(ctx, db); err != nil {
		return nil, err
	}
	units, err := uow.New(db, nil)
	if err != nil {
		return nil, err
	}
	if err := seed(ctx, units, "acc", cfg.Pending); err != nil {
		return nil, err
	}
	var out []claimPoint
	done := 0
	for _, sent := range []int{cfg.SentSmall, cfg.SentLarge} {
		if err := insertSent(ctx, db, done, sent); err != nil {
			return nil, err
		}
		done = sent
		p, err := measureClaims(ctx, db, cfg)
		if err != nil {
			return nil, fmt.Errorf("beside %d sent rows: %w", sent, err)
		}
		p.SentRows = sent
		out = append(out, p)
	}
	return out, nil
}

// insertSent adds sent rows numbered from+1..to, older than every pending
// row, in one INSERT ... SELECT generate_series (with the NOTIFY trigger
// off, since nobody listens to history).
const insertSentSQL = `INSERT INTO outbox_events (id, tenant_id, topic, aggregate_type, aggregate_id,
    aggregate_version, schema_version, payload, metadata, occurred_at, created_at, status, attempts,
    available_at, published_at)
SELECT '00' || lpad(g::text, 24, '0'), 'default', 'account.deposited', 'account',
       'sent-' || lpad((g / 10)::text, 7, '0'), g % 10 + 1, 1,
       jsonb_build_object('account_id', 'sent-' || lpad((g / 10)::text, 7, '0'), 'amount', g,
           'currency', 'EUR', 'reference', upper(substr(md5(g::text), 1, 26)), 'memo', ?::text),
       '{}', now() - interval '1 day', now() - interval '1 day', 'sent', 1,
       now() - interval '1 day', now() - interval '1 day'
FROM generate_series(?::int, ?::int) AS g`

func insertSent(ctx context.Context, db *gorm.DB, from, to int) error {
	if to <= from {
		return nil
	}
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("ALTER TABLE outbox_events DISABLE TRIGGER outbox_events_notify").Error; err != nil {
			return err
		}
		res := tx.Exec(insertSentSQL, memo, from+1, to)
		if res.Error != nil {
			return fmt.Errorf("insert sent rows: %w", res.Error)
		}
		if res.RowsAffected != int64(to-from) {
			return fmt.Errorf("inserted %d sent rows, want %d", res.RowsAffected, to-from)
		}
		return tx.Exec("ALTER TABLE outbox_events ENABLE TRIGGER outbox_events_notify").Error
	})
}

func measureClaims(ctx context.Context, db *gorm.DB, cfg claimConfig) (claimPoint, error) {
	var p claimPoint
	for _, q := range []string{"VACUUM ANALYZE outbox_events", "CHECKPOINT"} {
		if err := db.WithContext(ctx).Exec(q).Error; err != nil {
			return p, err
		}
	}
	store, err := outbox.NewStore(db, nil)
	if err != nil {
		return p, err
	}
	const warmup = 10
	var claimD, releaseD []time.Duration
	for i := range warmup + cfg.Claims {
		t0 := time.Now()
		rows, err := store.Claim(ctx, outbox.ClaimOpts{Worker: claimWorker, Limit: cfg.Limit, Lease: 30 * time.Second})
		t1 := time.Now()
		if err != nil {
			return p, err
		}
		if len(rows) != cfg.Limit {
			return p, fmt.Errorf("claim %d took %d rows, want %d", i, len(rows), cfg.Limit)
		}
		ids := make([]string, len(rows))
		for j, r := range rows {
			ids[j] = r.ID
		}
		if _, err := store.Release(ctx, claimWorker, ids); err != nil {
			return p, err
		}
		if i >= warmup {
			claimD = append(claimD, t1.Sub(t0))
			releaseD = append(releaseD, time.Since(t1))
		}
	}
	p.Claim, p.Release = summarize(claimD), summarize(releaseD)
	p.Plan, err = explainClaim(ctx, db, cfg.Limit)
	if err != nil {
		return p, fmt.Errorf("explain: %w", err)
	}
	p.Indexes = planIndexes(p.Plan)
	return p, nil
}

// sqlCapture is a GORM logger that keeps the last statement, with its
// values inlined, so the claim statement bento really runs can be
// explained.
type sqlCapture struct {
	mu   sync.Mutex
	last string
}

func (c *sqlCapture) LogMode(logger.LogLevel) logger.Interface { return c }
func (*sqlCapture) Info(context.Context, string, ...any)       {}
func (*sqlCapture) Warn(context.Context, string, ...any)       {}
func (*sqlCapture) Error(context.Context, string, ...any)      {}
func (c *sqlCapture) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	sql, _ := fc()
	c.mu.Lock()
	c.last = sql
	c.mu.Unlock()
}

// explainClaim runs one real Claim to capture its SQL, releases the rows,
// then runs EXPLAIN (ANALYZE, BUFFERS) of that statement in a transaction
// it rolls back.
func explainClaim(ctx context.Context, db *gorm.DB, limit int) (string, error) {
	capture := &sqlCapture{}
	store, err := outbox.NewStore(db.Session(&gorm.Session{Logger: capture}), nil)
	if err != nil {
		return "", err
	}
	rows, err := store.Claim(ctx, outbox.ClaimOpts{Worker: claimWorker, Limit: limit, Lease: 30 * time.Second})
	if err != nil {
		return "", err
	}
	capture.mu.Lock()
	claimSQL := capture.last
	capture.mu.Unlock()
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	if _, err := store.Release(ctx, claimWorker, ids); err != nil {
		return "", err
	}
	if !strings.Contains(claimSQL, "SKIP LOCKED") {
		return "", fmt.Errorf("captured statement is not the claim: %.80q", claimSQL)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return "", err
	}
	tx, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback() //nolint:errcheck // the EXPLAIN ANALYZE must not commit its UPDATE
	// GORM inlines times without a zone; they are UTC.
	if _, err := tx.ExecContext(ctx, "SET LOCAL TimeZone = 'UTC'"); err != nil {
		return "", err
	}
	res, err := tx.QueryContext(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+claimSQL)
	if err != nil {
		return "", err
	}
	defer res.Close()
	var lines []string
	for res.Next() {
		var l string
		if err := res.Scan(&l); err != nil {
			return "", err
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n"), res.Err()
}

// sqlTimer is a GORM logger that adds up the time spent in the outbox
// store's claim and mark-sent statements.
type sqlTimer struct {
	mu            sync.Mutex
	claim, settle time.Duration
}

func (t *sqlTimer) LogMode(logger.LogLevel) logger.Interface { return t }
func (*sqlTimer) Info(context.Context, string, ...any)       {}
func (*sqlTimer) Warn(context.Context, string, ...any)       {}
func (*sqlTimer) Error(context.Context, string, ...any)      {}
func (t *sqlTimer) Trace(_ context.Context, begin time.Time, fc func() (string, int64), _ error) {
	d := time.Since(begin)
	sql, _ := fc()
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case strings.HasPrefix(sql, "WITH cand AS"):
		t.claim += d
	case strings.HasPrefix(sql, "UPDATE outbox_events") && strings.Contains(sql, "status = 'sent'"),
		strings.HasPrefix(sql, "UPDATE outbox_events SET held = false"):
		t.settle += d
	}
}

var indexRE = regexp.MustCompile(`(?:Index(?: Only)? Scan(?: Backward)? using|Bitmap Index Scan on) (\S+)`)

// planIndexes lists, in order of first use, the indexes a plan scans.
func planIndexes(plan string) []string {
	var out []string
	for _, m := range indexRE.FindAllStringSubmatch(plan, -1) {
		if !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	return out
}
