// Package pglisten keeps one PostgreSQL connection in LISTEN mode on a
// channel and calls back for each notification, reconnecting with backoff
// when the connection drops. The projector (outbox commits) and the
// database bus (publishes) use it as their wake-up hint; polling stays
// their fallback, since a notification sent while the connection is down
// is lost.
package pglisten

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
)

// ErrNotPgx is returned by [Run] when db's driver is not pgx's
// database/sql driver, which LISTEN needs.
var ErrNotPgx = errors.New("pglisten: the database driver is not pgx's database/sql driver")

// Listener describes one LISTEN loop.
type Listener struct {
	// Channel is the channel to LISTEN on. It must be a plain identifier.
	Channel string
	// ApplicationName, when set, is the connection's application_name, so
	// operators can find it in pg_stat_activity.
	ApplicationName string
	// OnListen is called each time the connection is listening (after the
	// first connect and after every reconnect), with the connection's
	// current_schema(): notifications sent while it was not listening are
	// lost, so it is the moment to catch up. Optional.
	OnListen func(schema string)
	// OnNotify is called with each notification's payload and the
	// connection's current_schema().
	OnNotify func(payload, schema string)
	// Logger receives the reconnect and polling-only warnings, each with
	// the Prefix. Defaults to slog.Default().
	Logger *slog.Logger
	// Prefix starts every log message, e.g. "dbbus: ". Defaults to "".
	Prefix string
}

// Run listens until ctx ends, holding one connection of db's pool. When
// the connection drops it reconnects after a backoff (100 ms doubling to
// 10 s, back to 100 ms after a minute of listening). It returns when ctx
// ends, or at once, logging that the caller polls only, when db's driver
// is not pgx's (ErrNotPgx) or db has no pool.
func (l Listener) Run(ctx context.Context, db *sql.DB) {
	log := l.Logger
	if log == nil {
		log = slog.Default()
	}
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		started := time.Now()
		err := l.once(ctx, db)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrNotPgx) {
			log.Warn(l.Prefix+"cannot listen; polling only", "channel", l.Channel, "err", err)
			return
		}
		if time.Since(started) > time.Minute {
			delay = 100 * time.Millisecond
		}
		log.Warn(l.Prefix+"listening connection lost; reconnecting", "channel", l.Channel, "err", err, "in", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, 10*time.Second)
	}
}

// once listens on one connection until it fails or ctx ends.
func (l Listener) once(ctx context.Context, db *sql.DB) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("get connection: %w", err)
	}
	defer conn.Close()
	var loopErr error
	rawErr := conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			loopErr = fmt.Errorf("%w (got %T)", ErrNotPgx, dc)
			return loopErr
		}
		pc := sc.Conn()
		if l.ApplicationName != "" {
			if _, err := pc.Exec(ctx, "SET application_name = '"+strings.ReplaceAll(l.ApplicationName, "'", "")+"'"); err != nil {
				loopErr = err
				return driver.ErrBadConn
			}
		}
		var schema string
		if err := pc.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
			loopErr = err
			return driver.ErrBadConn
		}
		if _, err := pc.Exec(ctx, "LISTEN "+l.Channel); err != nil {
			loopErr = err
			return driver.ErrBadConn
		}
		if l.OnListen != nil {
			l.OnListen(schema)
		}
		for {
			n, err := pc.WaitForNotification(ctx)
			if err != nil {
				loopErr = err
				// The connection is in LISTEN mode (or broken): never hand
				// it back to the pool.
				return driver.ErrBadConn
			}
			l.OnNotify(n.Payload, schema)
		}
	})
	if loopErr != nil {
		return loopErr
	}
	return rawErr
}
