package projector

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/bentoevents/bento/outbox"
)

// ApplicationName returns the PostgreSQL application_name the projector's
// listening connection sets, so operators can find it in pg_stat_activity.
func (p *OutboxProjector) ApplicationName() string {
	name := "bento-projector:" + p.cfg.WorkerID
	if len(name) > 63 {
		name = name[:63]
	}
	return name
}

// listen keeps a LISTEN connection open until ctx ends, waking the projector
// for each notification of its schema (and tenant, when filtered). When the
// connection drops it reconnects with backoff and wakes the projector once,
// since notifications sent meanwhile are lost.
func (p *OutboxProjector) listen(ctx context.Context) {
	sqlDB, err := p.store.DB().DB()
	if err != nil {
		p.log.Warn("cannot listen for commits; polling only", "err", err)
		return
	}
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		started := time.Now()
		err := p.listenOnce(ctx, sqlDB)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errNotPgx) {
			p.log.Warn("cannot listen for commits; polling only", "err", err)
			return
		}
		if time.Since(started) > time.Minute {
			delay = 100 * time.Millisecond
		}
		p.log.Warn("listening connection lost; reconnecting", "err", err, "in", delay)
		p.sleep(ctx, delay, nil)
		delay = min(2*delay, 10*time.Second)
	}
}

var errNotPgx = errors.New("the database driver is not pgx's database/sql driver")

func (p *OutboxProjector) listenOnce(ctx context.Context, db *sql.DB) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("get connection: %w", err)
	}
	defer conn.Close()
	var loopErr error
	rawErr := conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			loopErr = fmt.Errorf("%w (got %T)", errNotPgx, dc)
			return loopErr
		}
		pc := sc.Conn()
		var schema string
		if _, err := pc.Exec(ctx, "SET application_name = '"+strings.ReplaceAll(p.ApplicationName(), "'", "")+"'"); err != nil {
			loopErr = err
			return driver.ErrBadConn
		}
		if err := pc.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
			loopErr = err
			return driver.ErrBadConn
		}
		if _, err := pc.Exec(ctx, "LISTEN "+outbox.NotifyChannel); err != nil {
			loopErr = err
			return driver.ErrBadConn
		}
		p.log.Debug("listening for commits", "channel", outbox.NotifyChannel, "schema", schema)
		p.Wake() // catch up on anything committed while not listening
		for {
			n, err := pc.WaitForNotification(ctx)
			if err != nil {
				loopErr = err
				// The connection is in LISTEN mode (or broken): never hand
				// it back to the pool.
				return driver.ErrBadConn
			}
			if p.wanted(n.Payload, schema) {
				p.Wake()
			}
		}
	})
	if loopErr != nil {
		return loopErr
	}
	return rawErr
}

// wanted reports whether a notification payload ("schema:tenant") concerns
// this projector.
func (p *OutboxProjector) wanted(payload, schema string) bool {
	s, t, ok := strings.Cut(payload, ":")
	if !ok {
		return true
	}
	if s != schema {
		return false
	}
	return p.cfg.Tenant == "" || t == p.cfg.Tenant
}
