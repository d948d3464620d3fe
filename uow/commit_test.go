package uow_test

import (
	"context"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
	"github.com/bentoevents/bento/uow"
)

func TestCommitSavesStateAndEvents(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := context.Background()
		a := OpenAccount("acc-1", "ann")
		e.stamper.Advance(time.Second) // the events are stamped at commit, not when recorded
		require.NoError(t, a.Deposit(50))
		pending := a.PendingEvents()
		require.Len(t, pending, 2)

		err := e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Track(a) })
		require.NoError(t, err)
		assert.Empty(t, a.PendingEvents(), "committed events are pulled off the aggregate")
		assert.Equal(t, int64(2), a.Version)

		stored := e.load(t, "acc-1")
		assert.Equal(t, int64(2), stored.Version)
		assert.Equal(t, int64(50), stored.Balance)

		rows := e.outboxRows(t)
		require.Len(t, rows, 2)
		for i, r := range rows {
			id, err := ulid.ParseStrict(r.ID)
			require.NoError(t, err, "the unit of work gives each event a ULID")
			assert.Equal(t, epoch.Add(time.Second).UnixMilli(), int64(id.Time()), "from the store's clock")
			assert.Equal(t, pending[i].Event.EventType(), r.Topic)
			assert.Equal(t, "account", r.AggregateType)
			assert.Equal(t, "acc-1", r.AggregateID)
			assert.Equal(t, int64(i+1), r.AggregateVersion)
			assert.Equal(t, tenant.Default, r.TenantID)
			assert.Equal(t, 1, r.SchemaVersion)
			assert.Equal(t, outbox.StatusNew, r.Status)
			assert.Equal(t, 0, r.Attempts)
			assert.Equal(t, "suite", r.Metadata[messaging.MetaProducer])
			assert.True(t, r.OccurredAt.Equal(epoch.Add(time.Second)), "occurred_at is the commit's time: %v", r.OccurredAt)
		}
		assert.Less(t, rows[0].ID, rows[1].ID, "ids sort in version order")
		assert.Equal(t, int64(1), rows[0].AggregateVersion)
		assert.JSONEq(t, `{"account_id":"acc-1","owner":"ann"}`, string(rows[0].Payload))
		assert.JSONEq(t, `{"account_id":"acc-1","amount":50}`, string(rows[1].Payload))

		// A second unit loads, changes and commits the stored aggregate.
		err = e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			acc, err := uow.Get[Account](ctx, u, "acc-1")
			if err != nil {
				return err
			}
			return acc.Deposit(25)
		})
		require.NoError(t, err)
		stored = e.load(t, "acc-1")
		assert.Equal(t, int64(3), stored.Version)
		assert.Equal(t, int64(75), stored.Balance)
		rows = e.outboxRows(t)
		require.Len(t, rows, 3)
		assert.Equal(t, int64(3), rows[2].AggregateVersion)
		assert.Equal(t, "account.deposited", rows[2].Topic)
	})
}
