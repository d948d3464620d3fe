package uow_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
	"github.com/bentoevents/bento/uow"
)

// TestNotifyOnCommitNotOnRollback listens on the outbox channel, rolls back a
// unit for one tenant, then commits a unit for another: the first (and only)
// notification for this schema must be the committed tenant's.
func TestNotifyOnCommitNotOnRollback(t *testing.T) {
	t.Parallel()
	db, dsn := testenv.Postgres(t)
	b := testenv.Backends()[0]
	e := setup(t, b, db)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var schema string
	require.NoError(t, db.Raw("SELECT current_schema()").Scan(&schema).Error)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "LISTEN "+outbox.NotifyChannel)
	require.NoError(t, err)

	// A projector waits for commits (without one, commits do not notify).
	require.NoError(t, e.units.Outbox().SetRelayIdle(ctx, "p1", true))

	// The rolled-back unit really inserts its row (firing the trigger)
	// inside the caller's transaction before that transaction rolls back.
	outer := db.Begin()
	require.NoError(t, e.units.RunTx(tenant.With(ctx, "t-rollback"), outer, func(ctx context.Context, u *uow.UnitOfWork) error {
		return u.Track(OpenAccount("acc-r2", "ann"))
	}))
	var inTx int64
	require.NoError(t, outer.Raw("SELECT count(*) FROM outbox_events").Scan(&inTx).Error)
	require.Equal(t, int64(1), inTx, "the row to roll back was inserted")
	require.NoError(t, outer.Rollback().Error)

	require.NoError(t, e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
		return u.Track(OpenAccount("acc-c", "ann"))
	}), "commit for the default tenant")

	for {
		n, err := conn.WaitForNotification(ctx)
		require.NoError(t, err, "no notification after commit")
		if !strings.HasPrefix(n.Payload, schema+":") {
			continue // another test's schema
		}
		assert.Equal(t, outbox.NotifyChannel, n.Channel)
		require.NotEqual(t, schema+":t-rollback", n.Payload, "a rolled-back insert notified")
		assert.Equal(t, schema+":default", n.Payload, "the first notification is the committed unit's")
		break
	}
}
