package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// The behavioural suites of this package also run on a partitioned table.
func init() {
	testenv.PartitionTables(func(t testing.TB, db *gorm.DB) {
		require.NoError(t, outbox.MigrateWith(context.Background(), db, &outbox.MigrateOpts{Partitioning: outbox.Daily}))
	})
}
