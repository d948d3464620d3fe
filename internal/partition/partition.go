// Package partition keeps bento's time-partitioned PostgreSQL tables
// (outbox_events, inbox_messages): it records a table's interval, creates its
// range partitions ahead of time, seals old partitions and drops the ones
// past retention. Its options, results and errors are those of the public
// package partition, which outbox and inbox hand to their users.
//
// Every step is its own short transaction that first takes a per-table
// advisory lock (so several processes may run maintenance at once: their
// steps take turns and each re-checks what is left to do) and then waits at
// most the lock timeout for any table lock, so maintenance yields to the
// relay instead of queueing it behind a long wait.
//
// Partitions are named <table>_pYYYYMMDD (daily) or <table>_pYYYYMM
// (monthly); each table also has a <table>_default partition that catches
// rows outside every range and is never dropped.
package partition

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/partition"
)

// start returns the start of the partition of interval i holding t, in UTC.
func start(i partition.Interval, t time.Time) time.Time {
	t = t.UTC()
	if i == partition.Monthly {
		return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

// add returns from moved by n partitions of interval i.
func add(i partition.Interval, from time.Time, n int) time.Time {
	if i == partition.Monthly {
		return from.AddDate(0, n, 0)
	}
	return from.AddDate(0, 0, n)
}

// layout is the time layout of the name suffix of i's partitions.
func layout(i partition.Interval) string {
	if i == partition.Monthly {
		return "200601"
	}
	return "20060102"
}

// Name returns the name of table's partition of interval i starting at
// from.
func Name(table string, i partition.Interval, from time.Time) string {
	return table + "_p" + from.UTC().Format(layout(i))
}

// Table describes a partitioned table.
type Table struct {
	// Name is the partitioned (parent) table.
	Name string
	// Bound returns the range bound for time t as an SQL literal.
	Bound func(t time.Time) string
	// Pending, when set, returns a query yielding one boolean: whether the
	// partition holds rows that must not be dropped. Such a partition is
	// neither sealed nor dropped.
	Pending func(partition string) string
	// Seal, when set, is the CHECK expression a partition gets once every
	// row in it is final (it must contradict Pending's condition), so the
	// planner leaves sealed partitions out of queries for pending rows.
	Seal string
	// AfterDrop, when set, runs after partitions ending at or before end
	// were dropped.
	AfterDrop func(ctx context.Context, db *gorm.DB, end time.Time) error
	// Retention is the table's default of MaintainOpts.Retention.
	Retention time.Duration
}

// settings are maintenance options with every default applied.
type settings struct {
	ahead                             int
	retention, sealAfter, lockTimeout time.Duration
	now                               time.Time
	dryRun                            bool
}

// now returns the time of c, or of aggregate.SystemClock for nil.
func now(c aggregate.Clock) time.Time {
	if c == nil {
		c = aggregate.SystemClock{}
	}
	return c.Now().UTC()
}

// resolve applies t's and the package's defaults to opts (nil: none set)
// for a table partitioned by i.
func resolve(t Table, i partition.Interval, opts *partition.MaintainOpts) settings {
	var o partition.MaintainOpts
	if opts != nil {
		o = *opts
	}
	s := settings{ahead: o.Ahead, retention: o.Retention, sealAfter: o.SealAfter, lockTimeout: o.LockTimeout,
		now: now(o.Clock), dryRun: o.DryRun}
	if s.ahead <= 0 {
		s.ahead = i.DefaultAhead()
	}
	if s.retention <= 0 {
		s.retention = t.Retention
	}
	if s.sealAfter <= 0 {
		s.sealAfter = partition.DefaultSealAfter
	}
	if s.lockTimeout <= 0 {
		s.lockTimeout = partition.DefaultLockTimeout
	}
	return s
}

var nameRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,40}$`)

const registry = `CREATE TABLE IF NOT EXISTS bento_partitioning (
	parent_table VARCHAR(63) PRIMARY KEY,
	part_interval VARCHAR(16) NOT NULL
)`

// Setup creates t partitioned as opts asks: it checks the database and
// opts.Partitioning, runs create (which applies the table's partitioned
// migrations), checks that t.Name was created partitioned, records its
// interval (or checks it against the recorded one) and creates its
// partitions from the current one to opts.Ahead after it.
//
// Errors: ErrUnsupported, ErrUnknownInterval, create's error,
// ErrNotPartitioned, ErrIntervalMismatch, a *StepError, or the database
// error (all of package partition).
func Setup(ctx context.Context, db *gorm.DB, t Table, opts partition.MigrateOpts, create func(context.Context) error) error {
	i := opts.Partitioning
	if d, err := dialect.Of(db); err != nil || d != dialect.Postgres {
		return fmt.Errorf("%w (%s)", partition.ErrUnsupported, d)
	}
	if i != partition.Daily && i != partition.Monthly {
		return fmt.Errorf("%w: %s", partition.ErrUnknownInterval, i)
	}
	if err := create(ctx); err != nil {
		return err
	}
	if err := checkTable(ctx, db, t); err != nil {
		return err
	}
	if err := db.WithContext(ctx).Exec(registry).Error; err != nil {
		return fmt.Errorf("create bento_partitioning: %w", err)
	}
	if err := db.WithContext(ctx).Exec(`INSERT INTO bento_partitioning (parent_table, part_interval)
		VALUES (?, ?) ON CONFLICT DO NOTHING`, t.Name, i.String()).Error; err != nil {
		return fmt.Errorf("record interval: %w", err)
	}
	got, err := interval(ctx, db, t.Name)
	if err != nil {
		return err
	}
	if got != i {
		return fmt.Errorf("%w: %s is %s, asked for %s", partition.ErrIntervalMismatch, t.Name, got, i)
	}
	s := resolve(t, i, &partition.MaintainOpts{Ahead: opts.Ahead, Clock: opts.Clock})
	errs, err := ensure(ctx, db, t, i, s, &partition.MaintainResult{})
	if err != nil {
		return err
	}
	return errors.Join(errs...)
}

// checkTable checks t's name and that the table is partitioned.
func checkTable(ctx context.Context, db *gorm.DB, t Table) error {
	if !nameRE.MatchString(t.Name) {
		return fmt.Errorf("invalid table name %q", t.Name)
	}
	var kind *string
	if err := db.WithContext(ctx).Raw("SELECT relkind::text FROM pg_class WHERE oid = to_regclass(?)", t.Name).
		Scan(&kind).Error; err != nil {
		return fmt.Errorf("read %s: %w", t.Name, err)
	}
	if kind == nil || *kind != "p" {
		return fmt.Errorf("%w: %s", partition.ErrNotPartitioned, t.Name)
	}
	return nil
}

// interval returns the recorded interval of table.
func interval(ctx context.Context, db *gorm.DB, table string) (partition.Interval, error) {
	var s []string
	err := db.WithContext(ctx).Raw(`SELECT part_interval FROM bento_partitioning
		WHERE to_regclass('bento_partitioning') IS NOT NULL AND parent_table = ?`, table).Scan(&s).Error
	if err != nil {
		return partition.None, fmt.Errorf("read bento_partitioning: %w", err)
	}
	if len(s) == 0 {
		return partition.None, fmt.Errorf("%w: no interval recorded for %s", partition.ErrNotPartitioned, table)
	}
	return partition.ParseInterval(s[0])
}

// Maintain creates t's partitions up to opts.Ahead after the current one,
// seals the old ones whose rows are all final, and drops those past
// retention that hold no pending rows; opts nil means defaults, and a zero
// Retention means t.Retention. It carries on past a failed step, except a
// lock timeout, where it stops (the next run resumes), and returns what it
// did with the steps' errors joined.
//
// Errors: ErrUnsupported, ErrNotPartitioned, *StepError (possibly wrapping
// ErrLockTimeout), or the database error (all of package partition).
func Maintain(ctx context.Context, db *gorm.DB, t Table, opts *partition.MaintainOpts) (*partition.MaintainResult, error) {
	res := &partition.MaintainResult{}
	if d, err := dialect.Of(db); err != nil || d != dialect.Postgres {
		return res, fmt.Errorf("%w (%s)", partition.ErrUnsupported, d)
	}
	if err := checkTable(ctx, db, t); err != nil {
		return res, err
	}
	i, err := interval(ctx, db, t.Name)
	if err != nil {
		return res, err
	}
	o := resolve(t, i, opts)
	if o.dryRun {
		return res, plan(ctx, db, t, i, o, res)
	}
	errs, err := ensure(ctx, db, t, i, o, res)
	if err != nil {
		return res, err
	}
	if yielded(errs) {
		return res, errors.Join(errs...)
	}
	parts, err := list(ctx, db, t.Name, i)
	if err != nil {
		return res, err
	}
	var droppedEnd time.Time
	for _, p := range parts {
		drop := !p.end.After(o.now.Add(-o.retention))
		if t.Seal != "" && !p.sealed && !p.end.After(o.now.Add(-o.sealAfter)) {
			sealed, err := seal(ctx, db, t, p, o.lockTimeout)
			switch {
			case err != nil:
				errs = append(errs, &partition.StepError{Table: t.Name, Partition: p.name, Step: "seal", Err: err})
				if yielded(errs) {
					return res, errors.Join(errs...)
				}
			case sealed:
				res.Sealed = append(res.Sealed, p.name)
			case !drop:
				res.Kept = append(res.Kept, p.name)
			}
		}
		if !drop {
			continue
		}
		dropped, kept, err := dropPartition(ctx, db, t, p.name, o.lockTimeout)
		switch {
		case err != nil:
			errs = append(errs, &partition.StepError{Table: t.Name, Partition: p.name, Step: "drop", Err: err})
			if yielded(errs) {
				return res, errors.Join(errs...)
			}
		case dropped:
			res.Dropped = append(res.Dropped, p.name)
			if p.end.After(droppedEnd) {
				droppedEnd = p.end
			}
		case kept:
			res.Kept = append(res.Kept, p.name)
		}
	}
	if !droppedEnd.IsZero() && t.AfterDrop != nil {
		if err := t.AfterDrop(ctx, db, droppedEnd); err != nil {
			errs = append(errs, &partition.StepError{Table: t.Name, Partition: "before " + droppedEnd.Format(time.RFC3339), Step: "cleanup", Err: err})
		}
	}
	return res, errors.Join(errs...)
}

// plan fills res with what Maintain would do now, reading the catalog and
// the partitions without locks.
func plan(ctx context.Context, db *gorm.DB, t Table, i partition.Interval, o settings, res *partition.MaintainResult) error {
	first := start(i, o.now)
	for k := 0; k <= o.ahead; k++ {
		name := Name(t.Name, i, add(i, first, k))
		var exists bool
		if err := db.WithContext(ctx).Raw("SELECT to_regclass(?) IS NOT NULL", name).Scan(&exists).Error; err != nil {
			return fmt.Errorf("plan %s: %w", name, err)
		}
		if !exists {
			res.Created = append(res.Created, name)
		}
	}
	parts, err := list(ctx, db, t.Name, i)
	if err != nil {
		return err
	}
	for _, p := range parts {
		drop := !p.end.After(o.now.Add(-o.retention))
		sealDue := t.Seal != "" && !p.sealed && !p.end.After(o.now.Add(-o.sealAfter))
		if !drop && !sealDue {
			continue
		}
		err := checkPending(db.WithContext(ctx), t, p.name)
		switch {
		case errors.Is(err, errKeep):
			res.Kept = append(res.Kept, p.name)
			continue
		case err != nil:
			return fmt.Errorf("plan %s: %w", p.name, err)
		}
		if sealDue {
			res.Sealed = append(res.Sealed, p.name)
		}
		if drop {
			res.Dropped = append(res.Dropped, p.name)
		}
	}
	return nil
}

// yielded reports whether the last step gave up on a lock: the run stops
// there rather than queue every later step behind the same holder.
func yielded(errs []error) bool {
	return len(errs) > 0 && errors.Is(errs[len(errs)-1], partition.ErrLockTimeout)
}

// ensure creates the partitions from o.now's to o.ahead after it. Step
// errors are returned in errs; err is a failure to read the catalog.
func ensure(ctx context.Context, db *gorm.DB, t Table, i partition.Interval, o settings, res *partition.MaintainResult) (errs []error, err error) {
	first := start(i, o.now)
	for k := 0; k <= o.ahead; k++ {
		from, to := add(i, first, k), add(i, first, k+1)
		name := Name(t.Name, i, from)
		created := false
		// SHARE UPDATE EXCLUSIVE is what ATTACH takes on the parent anyway.
		err := step(ctx, db, t, o.lockTimeout, "SHARE UPDATE EXCLUSIVE", func(tx *gorm.DB) error {
			var exists bool
			if err := tx.Raw("SELECT to_regclass(?) IS NOT NULL", name).Scan(&exists).Error; err != nil {
				return err
			}
			if exists {
				return nil
			}
			// Create, then attach: ATTACH takes only SHARE UPDATE EXCLUSIVE on
			// the parent (CREATE ... PARTITION OF takes ACCESS EXCLUSIVE), and
			// ACCESS EXCLUSIVE on the default partition while it checks that
			// the default holds no row of the new range.
			if err := tx.Exec(fmt.Sprintf("CREATE TABLE %s (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
				name, t.Name)).Error; err != nil {
				return err
			}
			if err := tx.Exec(fmt.Sprintf("ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (%s) TO (%s)",
				t.Name, name, t.Bound(from), t.Bound(to))).Error; err != nil {
				return err
			}
			created = true
			return nil
		})
		var pg *pgconn.PgError
		switch {
		case errors.As(err, &pg) && pg.Code == "23514":
			// The default partition holds rows of this range (maintenance
			// fell behind): they stay there, and the range stays uncovered.
			res.Blocked = append(res.Blocked, name)
		case err != nil:
			errs = append(errs, &partition.StepError{Table: t.Name, Partition: name, Step: "create", Err: err})
			if errors.Is(err, partition.ErrLockTimeout) {
				return errs, nil
			}
		case created:
			res.Created = append(res.Created, name)
		}
	}
	return errs, nil
}

type part struct {
	name       string
	start, end time.Time
	// constrained: the seal constraint exists; sealed: and is validated.
	constrained, sealed bool
}

// list returns t's range partitions named by bento, oldest first.
func list(ctx context.Context, db *gorm.DB, table string, i partition.Interval) ([]part, error) {
	type row struct {
		Name        string
		Constrained bool
		Sealed      bool
	}
	var rows []row
	err := db.WithContext(ctx).Raw(`SELECT c.relname AS name,
		       k.oid IS NOT NULL AS constrained,
		       COALESCE(k.convalidated, false) AS sealed
		FROM pg_inherits h
		JOIN pg_class c ON c.oid = h.inhrelid
		LEFT JOIN pg_constraint k ON k.conrelid = c.oid AND k.conname = c.relname || '_sealed'
		WHERE h.inhparent = to_regclass(?)
		ORDER BY c.relname`, table).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("list partitions of %s: %w", table, err)
	}
	var out []part
	for _, r := range rows {
		suffix, ok := strings.CutPrefix(r.Name, table+"_p")
		if !ok {
			continue // the default partition, or one bento did not make
		}
		from, err := time.Parse(layout(i), suffix)
		if err != nil {
			continue
		}
		out = append(out, part{name: r.Name, start: from, end: add(i, from, 1), constrained: r.Constrained, sealed: r.Sealed})
	}
	return out, nil
}

// errKeep rolls a step back when the partition holds pending rows.
var errKeep = errors.New("partition holds pending rows")

// seal adds the seal constraint to p, checking under its lock that no row
// is pending, then validates it in a second transaction (which scans the
// partition under SHARE UPDATE EXCLUSIVE, blocking neither reads nor
// writes). It reports false when p holds pending rows.
func seal(ctx context.Context, db *gorm.DB, t Table, p part, lockTimeout time.Duration) (bool, error) {
	constraint := p.name + "_sealed"
	if !p.constrained {
		err := step(ctx, db, t, lockTimeout, "ACCESS SHARE", func(tx *gorm.DB) error {
			var state []bool
			if err := tx.Raw(`SELECT k.oid IS NOT NULL FROM pg_class c
				LEFT JOIN pg_constraint k ON k.conrelid = c.oid AND k.conname = ?
				WHERE c.oid = to_regclass(?)`, constraint, p.name).Scan(&state).Error; err != nil {
				return err
			}
			if len(state) == 0 || state[0] {
				return nil // dropped or constrained by another process meanwhile
			}
			// NOT VALID: enforced for every write from now on, checked for
			// the existing rows by the pending query below while this
			// statement's ACCESS EXCLUSIVE lock keeps writers out.
			if err := tx.Exec(fmt.Sprintf("ALTER TABLE %s ADD CONSTRAINT %s CHECK (%s) NOT VALID",
				p.name, constraint, t.Seal)).Error; err != nil {
				return err
			}
			return checkPending(tx, t, p.name)
		})
		if errors.Is(err, errKeep) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
	err := step(ctx, db, t, lockTimeout, "ACCESS SHARE", func(tx *gorm.DB) error {
		var exists bool
		if err := tx.Raw("SELECT to_regclass(?) IS NOT NULL", p.name).Scan(&exists).Error; err != nil || !exists {
			return err
		}
		return tx.Exec(fmt.Sprintf("ALTER TABLE %s VALIDATE CONSTRAINT %s", p.name, constraint)).Error
	})
	return err == nil, err
}

// dropPartition drops p unless it holds pending rows, which it checks under
// an ACCESS EXCLUSIVE lock on the parent: no query reaches p meanwhile, and
// every transaction that wrote to it has ended. It reports whether p was
// dropped, and whether it was kept; neither when it was already gone.
func dropPartition(ctx context.Context, db *gorm.DB, t Table, name string, lockTimeout time.Duration) (dropped, kept bool, err error) {
	// ACCESS EXCLUSIVE on the parent, which DROP takes anyway, before the
	// partition: taking the partition first (as DROP TABLE alone does)
	// could deadlock with a query that holds the parent and waits for it.
	err = step(ctx, db, t, lockTimeout, "ACCESS EXCLUSIVE", func(tx *gorm.DB) error {
		dropped = false
		var exists bool
		if err := tx.Raw("SELECT to_regclass(?) IS NOT NULL", name).Scan(&exists).Error; err != nil || !exists {
			return err
		}
		if err := checkPending(tx, t, name); err != nil {
			return err
		}
		if err := tx.Exec("DROP TABLE " + name).Error; err != nil {
			return err
		}
		dropped = true
		return nil
	})
	if errors.Is(err, errKeep) {
		return false, true, nil
	}
	return dropped && err == nil, false, err
}

// checkPending returns errKeep when partition holds pending rows.
func checkPending(tx *gorm.DB, t Table, partition string) error {
	if t.Pending == nil {
		return nil
	}
	var pending bool
	if err := tx.Raw(t.Pending(partition)).Scan(&pending).Error; err != nil {
		return err
	}
	if pending {
		return errKeep
	}
	return nil
}

// lockAttempts is how often a step that timed out on a lock is tried.
const lockAttempts = 3

// step runs fn in a transaction holding t's maintenance advisory lock, with
// lock_timeout set for every other lock, and the parent table locked in
// mode. A lock timeout is retried after a pause; the last one is returned
// wrapping ErrLockTimeout.
//
// The parent lock comes before fn looks at the catalog: taking a table lock
// makes the backend apply the catalog changes other sessions committed (an
// advisory lock does not), so fn sees partitions another maintainer just
// created or dropped. It also orders the locks as queries do, parent first.
func step(ctx context.Context, db *gorm.DB, t Table, lockTimeout time.Duration, mode string, fn func(tx *gorm.DB) error) error {
	for attempt := 1; ; attempt++ {
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			// Taken before lock_timeout is set: waiting for another
			// maintainer blocks nobody else.
			if err := tx.Exec("SELECT pg_advisory_xact_lock(hashtext('bento.partition'), hashtext(current_schema() || '.' || ?))",
				t.Name).Error; err != nil {
				return err
			}
			if err := tx.Exec(fmt.Sprintf("SET LOCAL lock_timeout = %d", max(lockTimeout.Milliseconds(), 1))).Error; err != nil {
				return err
			}
			if err := tx.Exec(fmt.Sprintf("LOCK TABLE ONLY %s IN %s MODE", t.Name, mode)).Error; err != nil {
				return err
			}
			return fn(tx)
		})
		var pg *pgconn.PgError
		if !errors.As(err, &pg) || pg.Code != "55P03" {
			return err
		}
		if attempt == lockAttempts {
			return fmt.Errorf("%w: %w", partition.ErrLockTimeout, err)
		}
		pause := time.NewTimer(time.Duration(attempt) * lockTimeout)
		select {
		case <-ctx.Done():
			pause.Stop()
			return ctx.Err()
		case <-pause.C:
		}
	}
}
