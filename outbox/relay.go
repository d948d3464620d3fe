package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
)

// ErrInvalidClaim is returned for a claim or outcome with a missing worker,
// a non-positive limit or lease.
var ErrInvalidClaim = errors.New("outbox: invalid claim")

// ClaimOpts say what a worker claims.
type ClaimOpts struct {
	// Worker identifies the claimer; outcomes are only recorded for the
	// worker that holds the lease.
	Worker string
	// Limit is the most rows claimed.
	Limit int
	// Lease is how long the rows stay reserved for Worker, by the
	// database's clock. A row whose lease ran out (its worker crashed or
	// stalled) can be claimed again; the takeover counts as a failed
	// attempt.
	Lease time.Duration
	// Tenant, when set, restricts the claim to one tenant's rows.
	Tenant string
	// MaxBytes, when positive, bounds the payload and metadata bytes of the
	// rows claimed together (their SizeBytes); the first row is claimed
	// whatever its size, so a large event goes out alone. Zero means no
	// bound.
	MaxBytes int64
}

// Claim leases up to opts.Limit rows that are due — new, failed and due for
// retry, or publishing under an expired lease — by the database's clock, in
// one short statement, and returns them ordered by id. On PostgreSQL
// concurrent claimers skip each other's rows (FOR UPDATE SKIP LOCKED); on
// SQLite writers are serialised.
//
// Per-aggregate order: a row is only claimable while no earlier event (lower
// aggregate_version) of the same aggregate is new, publishing, failed or
// dead, so at most one event per aggregate is in flight at a time across all
// workers, and a dead event holds back the later events of its own aggregate
// (and only those) until it is requeued or discarded. Rows without an
// aggregate are not ordered.
//
// A row found waiting behind an earlier event is marked held and leaves the
// index claims walk, so its cost is paid once: however many events pile up
// behind a dead, retried or busy event, a claim reads only rows it can take.
// Settling the earlier event (MarkSent, DeleteSent, Discard) releases the
// next held row of its aggregate. When a claim finds nothing but rows to
// hold, or fewer than opts.Limit rows besides those it held, it looks
// again at once, so a pile-up never makes a claim come back short while
// other rows are due; on PostgreSQL each such round starts where the one
// before stopped, so a claim judges each due row once.
//
// Errors: ErrInvalidClaim, ErrClosed, or the database error.
func (s *Store) Claim(ctx context.Context, opts ClaimOpts) ([]*Message, error) {
	if opts.Worker == "" || opts.Limit < 1 || opts.Lease <= 0 || opts.MaxBytes < 0 {
		return nil, fmt.Errorf("%w: worker %q, limit %d, lease %v, max bytes %d",
			ErrInvalidClaim, opts.Worker, opts.Limit, opts.Lease, opts.MaxBytes)
	}
	maxBytes := opts.MaxBytes
	if maxBytes == 0 {
		maxBytes = math.MaxInt64
	}
	args := map[string]any{
		"now":        s.clock.now(),
		"until":      s.clock.in(opts.Lease),
		"worker":     opts.Worker,
		"tenant":     opts.Tenant,
		"limit":      opts.Limit,
		"scan":       opts.Limit,
		"max_bytes":  maxBytes,
		"first_free": true,
		"after_at":   nil,
		"after_id":   "",
		"lease":      opts.Lease,
	}
	// Rows held back, and rows waiting behind the claim's own rows, do not
	// count against the limit: while the last round held some back or left
	// some waiting, claim again for the rest, looking further ahead, from
	// the round's edge on PostgreSQL (pgClaimSQL).
	var out []*Message
	looked := 0
	for {
		got, held, edge, err := s.claimOnce(ctx, args, opts.Tenant != "")
		if err != nil {
			return nil, wrapDB("outbox: claim", err)
		}
		looked += args["scan"].(int)
		out = append(out, got...)
		waiting := false
		for _, m := range got {
			maxBytes -= int64(m.SizeBytes)
			waiting = waiting || m.NextWaits
		}
		more := held > 0 || waiting && len(got) > 0 && looked < maxLook
		if !more || len(out) >= opts.Limit || maxBytes <= 0 {
			break
		}
		args["limit"] = opts.Limit - len(out)
		args["scan"] = nextScan(args["scan"].(int), len(got), args["limit"].(int))
		args["max_bytes"] = maxBytes
		args["first_free"] = len(out) == 0
		if edge.id != "" {
			args["after_at"], args["after_id"] = edge.at, edge.id
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// maxScan bounds how many due rows one round of a claim looks at.
const maxScan = 5000

// maxLook bounds how many due rows the rounds of one claim look at for
// rows left waiting behind the rows it took (rounds after one that held
// rows back look on regardless: those rows left the due index).
const maxLook = 2 * maxScan

// nextScan is how many due rows the next round of a claim looks at, after
// a round that looked at scan rows and claimed got of them, with limit
// rows still to claim. It looks further ahead each round, so rows piled
// up behind a few events, or a few busy aggregates' later versions, cost
// rounds of growing size, not one each: twice as far, but no further than
// the round's yield says the rest of the limit needs (a quarter more, for
// luck), since a round judges every row it looks at.
func nextScan(scan, got, limit int) int {
	next := 2 * scan
	if got > 0 {
		need := (limit*scan + got - 1) / got
		next = min(next, need+need/4)
	}
	return min(max(next, limit), maxScan)
}

// edge is the due row where a claim's next round starts (claimEdge); its
// zero value, on SQLite, leaves the start where it was.
type edge struct {
	at time.Time
	id string
}

// claimOnce runs the claim statement(s) once and returns the rows claimed,
// how many rows it held back, and the round's edge.
func (s *Store) claimOnce(ctx context.Context, args map[string]any, byTenant bool) ([]*Message, int64, edge, error) {
	var e edge
	if s.dialect == dialect.SQLite {
		out, held, err := s.claimSQLite(ctx, args, byTenant)
		return out, held, e, err
	}
	// On PostgreSQL the claim runs under a statement timeout of its own
	// (claimTimeout): a claim whose client died or was cut off keeps
	// running on the server, holding its row locks on the heads of the
	// aggregates it looked at and the oldest snapshot, until it ends.
	var (
		out  []*Message
		held int64
	)
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		ms := strconv.FormatInt(claimTimeout(args["lease"].(time.Duration)).Milliseconds(), 10)
		if err := tx.Exec(claimSettingsSQL, ms).Error; err != nil {
			return err
		}
		var err error
		out, held, err = readClaim(tx, args, claimSQL(s.dialect, byTenant), &e)
		return err
	})
	return out, held, e, err
}

// claimSQLite holds back, in statements of their own each looking at the
// first @limit due rows, until the front is free of rows to hold, then
// claims; it returns the rows claimed and how many it held back.
func (s *Store) claimSQLite(ctx context.Context, args map[string]any, byTenant bool) ([]*Message, int64, error) {
	var held int64
	for {
		res := s.db.WithContext(ctx).Exec(holdSQL(byTenant), args)
		if res.Error != nil {
			return nil, 0, res.Error
		}
		if res.RowsAffected == 0 {
			break
		}
		held += res.RowsAffected
	}
	out, claimedHeld, err := readClaim(s.db.WithContext(ctx), args, claimSQL(s.dialect, byTenant), nil)
	return out, held + claimedHeld, err
}

// claimTimeout bounds a claim statement on PostgreSQL: half the lease it
// takes (a claim that ran longer would hand out rows whose lease is mostly
// gone), and no more than maxClaimTime.
func claimTimeout(lease time.Duration) time.Duration {
	return max(min(lease/2, maxClaimTime), time.Second)
}

// maxClaimTime is the longest a claim statement may run on PostgreSQL.
const maxClaimTime = 10 * time.Second

// readClaim runs the claim statement query in db and reads its rows: the
// rows claimed and how many it held back; edgeTo, when not nil
// (PostgreSQL), receives the round's edge.
func readClaim(db *gorm.DB, args map[string]any, query string, edgeTo *edge) ([]*Message, int64, error) {
	rows, err := db.Raw(query, args).Rows()
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var held int64
	var out []*Message
	var extra []any
	if edgeTo != nil {
		extra = []any{&edgeTo.at, &edgeTo.id}
	}
	for rows.Next() {
		m, wasHeld, err := scanClaimed(rows, extra...)
		if err != nil {
			return nil, 0, err
		}
		if wasHeld {
			held++
			continue
		}
		out = append(out, m)
	}
	return out, held, rows.Err()
}

// scanClaimed reads one row of a claim: the held-back flag, then
// returningColumns, then nextWaits, then the columns after them into
// extra (a PostgreSQL claim's edge, a leased release's lateness). It
// replaces GORM's reflection-driven Scan on the relay's hot path, where
// that was most of a claim's CPU in the relay process.
func scanClaimed(rows *sql.Rows, extra ...any) (*Message, bool, error) {
	m := &Message{}
	var status string
	var held bool
	dest := []any{&held, &m.ID, &m.TenantID, &m.Topic, &m.AggregateType, &m.AggregateID, &m.AggregateVersion,
		&m.SchemaVersion, &m.Payload, &m.Metadata, &m.OccurredAt, &m.CreatedAt, &status,
		&m.Attempts, &m.AvailableAt, &m.LockedBy, &m.LockedUntil, &m.LastError, &m.PublishedAt,
		&m.FailedAt, &m.DedupKey, &m.SizeBytes, &m.NextWaits}
	err := rows.Scan(append(dest, extra...)...)
	m.Status = Status(status)
	m.Held = held
	return m, held, err
}

// MarkSent records that the broker confirmed the rows with ids, and
// releases the next held row of each of their aggregates, in one
// transaction. It returns how many rows were marked; rows whose lease was
// taken over by another worker are left alone (the new owner records them).
func (s *Store) MarkSent(ctx context.Context, worker string, ids []string) (int64, error) {
	return s.settle(ctx, nil, "mark sent", markSentSQL, worker, ids)
}

// MarkSentTx is MarkSent inside the caller's transaction tx, on the
// store's database: the rows are marked, and the next held rows released,
// if and only if tx commits, and MarkSentTx never commits or rolls back.
// It is fenced as MarkSent is: only rows still leased to worker are marked,
// and on PostgreSQL they stay locked until tx ends, so no other worker
// takes their lease over meanwhile. A caller that publishes the rows in
// tx (to a bus whose queues live in the same database) and commits only
// when the count returned is len(ids) publishes each row exactly once.
//
// Errors: as MarkSent.
func (s *Store) MarkSentTx(ctx context.Context, tx *gorm.DB, worker string, ids []string) (int64, error) {
	return s.settle(ctx, tx, "mark sent", markSentSQL, worker, ids)
}

// DeleteSent is MarkSent for projectors configured to delete rows once they
// are published instead of keeping them as sent.
func (s *Store) DeleteSent(ctx context.Context, worker string, ids []string) (int64, error) {
	return s.settle(ctx, nil, "delete sent", deleteSentSQL, worker, ids)
}

// DeleteSentTx is DeleteSent inside the caller's transaction tx, as
// MarkSentTx is MarkSent.
func (s *Store) DeleteSentTx(ctx context.Context, tx *gorm.DB, worker string, ids []string) (int64, error) {
	return s.settle(ctx, tx, "delete sent", deleteSentSQL, worker, ids)
}

// Release hands back rows claimed by worker that it did not try to publish
// (for example on shutdown): they become claimable at once, with their
// attempts unchanged.
func (s *Store) Release(ctx context.Context, worker string, ids []string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	if worker == "" {
		return 0, fmt.Errorf("outbox: release: %w: empty worker", ErrInvalidClaim)
	}
	res := s.db.WithContext(ctx).Exec(releaseSQL, map[string]any{"now": s.clock.now(), "worker": worker, "ids": ids})
	if res.Error != nil {
		return 0, wrapDB("outbox: release", res.Error)
	}
	return res.RowsAffected, nil
}

// settle runs query, a statement that moves worker's rows ids out of the
// unsent states and returns their aggregates, and promotes the next held
// row of those aggregates in the same transaction: tx, or one of its own
// when tx is nil.
func (s *Store) settle(ctx context.Context, tx *gorm.DB, op, query, worker string, ids []string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	if worker == "" {
		return 0, fmt.Errorf("outbox: %s: %w: empty worker", op, ErrInvalidClaim)
	}
	args := map[string]any{"now": s.clock.now(), "worker": worker, "ids": ids}
	var n int64
	var err error
	if tx == nil {
		n, err = s.leaveTx(ctx, query, args)
	} else {
		n, err = s.leave(tx.WithContext(ctx), query, args)
	}
	if err != nil {
		return 0, wrapDB("outbox: "+op, err)
	}
	return n, nil
}

// leaveTx runs leave in a transaction of its own, which commits
// asynchronously on PostgreSQL (dialect.CommitAsync): a crash of the server
// can only undo it, and the rows are published again.
func (s *Store) leaveTx(ctx context.Context, query string, args map[string]any) (int64, error) {
	var n int64
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := dialect.CommitAsync(tx); err != nil {
			return err
		}
		var err error
		n, err = s.leave(tx, query, args)
		return err
	})
	return n, err
}

// leave runs query within tx — a statement that moves rows out of the
// unsent states (sent, deleted) and returns the aggregate of each — then
// promotes the aggregates' next held rows, and returns how many rows query
// changed.
func (s *Store) leave(tx *gorm.DB, query string, args map[string]any) (int64, error) {
	rows, err := tx.Raw(query, bind(query, args)...).Rows()
	if err != nil {
		return 0, err
	}
	var keys [][3]string
	for rows.Next() {
		var k [3]string
		if err := rows.Scan(&k[0], &k[1], &k[2]); err != nil {
			rows.Close()
			return 0, err
		}
		keys = append(keys, k)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	return int64(len(keys)), promote(tx, keys)
}

// promote releases the first held row of each aggregate in keys (tenant,
// type, id; rows without an aggregate are skipped). It must run in the
// transaction that moved those aggregates' events out of the unsent states,
// after that change: see pgClaimSQL for why that keeps a held row from
// being forgotten.
func promote(tx *gorm.DB, keys [][3]string) error {
	seen := map[[3]string]bool{}
	var aggs []any
	for _, k := range keys {
		if k[2] != "" && !seen[k] {
			seen[k] = true
			aggs = append(aggs, k[0], k[1], k[2])
		}
	}
	// Bind parameters are limited (65,535 on PostgreSQL): promote in chunks
	// of 1,000 aggregates.
	for start := 0; start < len(aggs); start += 3000 {
		chunk := aggs[start:min(start+3000, len(aggs))]
		if err := tx.Exec(promoteSQL(len(chunk)/3), chunk...).Error; err != nil {
			return fmt.Errorf("release held events: %w", err)
		}
	}
	return nil
}

// Failure is the outcome of a failed publish of one claimed row.
type Failure struct {
	// ID is the row.
	ID string
	// Err is what went wrong; it is stored truncated to MaxLastErrorLen.
	Err error
	// RetryAfter is how long after now, by the database's clock, the row
	// becomes claimable again. Zero or negative means at once.
	RetryAfter time.Duration
	// Dead gives up on the row: it ends in status dead with its last error.
	Dead bool
}

// MarkFailed records a failed attempt: attempts+1, last_error, and status
// failed (claimable again RetryAfter from now, by the database's clock) or
// dead. It reports whether the row
// was still leased to worker.
func (s *Store) MarkFailed(ctx context.Context, worker string, f Failure) (bool, error) {
	if worker == "" || f.ID == "" {
		return false, fmt.Errorf("outbox: mark failed: %w: worker %q, id %q", ErrInvalidClaim, worker, f.ID)
	}
	status := StatusFailed
	if f.Dead {
		status = StatusDead
	}
	msg := "unknown error"
	if f.Err != nil {
		msg = f.Err.Error()
	}
	res := s.db.WithContext(ctx).Exec(markFailedSQL, map[string]any{
		"status": status, "retry_at": s.clock.in(max(f.RetryAfter, 0)), "error": TruncateError(msg),
		"id": f.ID, "worker": worker, "now": s.clock.now(),
	})
	if res.Error != nil {
		return false, wrapDB("outbox: mark failed", res.Error)
	}
	return res.RowsAffected == 1, nil
}

// TruncateError cuts msg to at most MaxLastErrorLen characters (whole runes),
// the size of the last_error column.
func TruncateError(msg string) string {
	if utf8.RuneCountInString(msg) <= MaxLastErrorLen {
		return msg
	}
	r := []rune(msg)
	return string(r[:MaxLastErrorLen-3]) + "..."
}
