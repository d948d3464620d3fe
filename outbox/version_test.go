package outbox_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// TestManualModeVersions checks what orders an aggregate's events written
// with Store.Add: a version of at least 1, and one event per version,
// including when two writers race for the same version.
func TestManualModeVersions(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		add := func(opts *outbox.AddOpts) error {
			return db.Transaction(func(tx *gorm.DB) error {
				_, err := e.store.Add(ctx, tx, "order.paid", orderPaid{}, opts)
				return err
			})
		}
		var verr *outbox.ValidationError
		err := add(&outbox.AddOpts{AggregateType: "order", AggregateID: "o-1"})
		require.ErrorIs(t, err, outbox.ErrInvalidEvent, "version 0 of an aggregate")
		require.ErrorAs(t, err, &verr)
		assert.Equal(t, "aggregate_version", verr.Field)
		require.ErrorIs(t, add(&outbox.AddOpts{AggregateVersion: 3}), outbox.ErrInvalidEvent, "a version without an aggregate")

		require.NoError(t, add(&outbox.AddOpts{AggregateType: "order", AggregateID: "o-1", AggregateVersion: 1}))
		err = add(&outbox.AddOpts{AggregateType: "order", AggregateID: "o-1", AggregateVersion: 1})
		require.ErrorIs(t, err, outbox.ErrDuplicateVersion)
		require.NoError(t, add(&outbox.AddOpts{AggregateType: "order", AggregateID: "o-1", AggregateVersion: 1, Tenant: "acme"}),
			"versions are per tenant")
		require.NoError(t, add(&outbox.AddOpts{AggregateType: "invoice", AggregateID: "o-1", AggregateVersion: 1}),
			"and per aggregate type")

		// Two versions alike in one batch fail before anything is written.
		batch := func() []*outbox.Message {
			return []*outbox.Message{
				{ID: e.stamper.NewID(epoch), Topic: "order.paid", AggregateType: "order", AggregateID: "o-2", AggregateVersion: 1, Payload: outbox.JSON(`{}`)},
				{ID: e.stamper.NewID(epoch), Topic: "order.paid", AggregateType: "order", AggregateID: "o-2", AggregateVersion: 1, Payload: outbox.JSON(`{}`)},
			}
		}
		require.ErrorIs(t, db.Transaction(func(tx *gorm.DB) error { return e.store.Insert(ctx, tx, batch()) }), outbox.ErrDuplicateVersion)
		assert.Equal(t, int64(0), countRows(t, db, "aggregate_id = 'o-2'"))
		assert.Equal(t, int64(3), countRows(t, db, ""), "nothing of the failed writes was kept")

		if b.Name == "sqlite" {
			return // SQLite serialises writers: no race to run
		}
		// Writers racing for one version: exactly one wins.
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = add(&outbox.AddOpts{AggregateType: "order", AggregateID: "o-race", AggregateVersion: 1})
			}()
		}
		wg.Wait()
		won := 0
		for _, err := range errs {
			if err == nil {
				won++
			} else {
				assert.ErrorIs(t, err, outbox.ErrDuplicateVersion)
			}
		}
		assert.Equal(t, 1, won)
		assert.Equal(t, int64(1), countRows(t, db, "aggregate_id = 'o-race'"))
	})
}
