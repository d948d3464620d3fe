package projector

import (
	"context"
	"strings"

	"github.com/bentoevents/bento/internal/pglisten"
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
	pglisten.Listener{
		Channel:         outbox.NotifyChannel,
		ApplicationName: p.ApplicationName(),
		Logger:          p.log,
		OnListen: func(schema string) {
			p.log.Debug("listening for commits", "channel", outbox.NotifyChannel, "schema", schema)
			p.Wake() // catch up on anything committed while not listening
		},
		OnNotify: func(payload, schema string) {
			if p.wanted(payload, schema) {
				p.Wake()
			}
		},
	}.Run(ctx, sqlDB)
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
