package idempotency_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// TestNewValidatesConfig checks that New rejects a bad configuration with
// ErrInvalidConfig, naming every bad field, and fills in the defaults.
func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))

	_, err := idempotency.New(db, &idempotency.Config{
		TTL: -time.Second, MaxBodyBytes: -1, LockTimeout: -time.Millisecond,
		StoredHeaders: []string{"Location", "Bad Header", ""},
	})
	require.ErrorIs(t, err, idempotency.ErrInvalidConfig)
	for _, field := range []string{"TTL", "MaxBodyBytes", "LockTimeout", "StoredHeaders[1]", "StoredHeaders[2]"} {
		assert.Contains(t, err.Error(), field)
	}
	assert.NotContains(t, err.Error(), "StoredHeaders[0]")

	for _, c := range []struct {
		field string
		cfg   *idempotency.Config
	}{
		{"TTL", &idempotency.Config{SingleCaller: true, TTL: -1}},
		{"MaxBodyBytes", &idempotency.Config{SingleCaller: true, MaxBodyBytes: -5}},
		{"LockTimeout", &idempotency.Config{SingleCaller: true, LockTimeout: -1}},
		{"LockTimeout", &idempotency.Config{SingleCaller: true, LockTimeout: 25 * 24 * time.Hour}}, // over 2^31-1 ms
	} {
		_, err := idempotency.New(db, c.cfg)
		require.ErrorIs(t, err, idempotency.ErrInvalidConfig, c.field)
		assert.True(t, strings.Contains(err.Error(), c.field+":"), "%s: %v", c.field, err)
	}

	single := &idempotency.Config{SingleCaller: true}
	_, err = idempotency.New(nil, single)
	require.ErrorIs(t, err, idempotency.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "db:")
	_, err = idempotency.New(&gorm.DB{Config: &gorm.Config{}}, single)
	require.ErrorIs(t, err, idempotency.ErrInvalidConfig)

	l, err := idempotency.New(db, single)
	require.NoError(t, err)
	c := l.Config()
	assert.Equal(t, 24*time.Hour, c.TTL)
	assert.Equal(t, int64(1<<20), c.MaxBodyBytes)
	assert.Equal(t, 5*time.Second, c.LockTimeout)
	assert.Equal(t, []string{"Content-Type", "Location", "Content-Location", "Etag", "Last-Modified"}, c.StoredHeaders)
	assert.NotNil(t, c.Tenant)
	assert.Equal(t, aggregate.SystemClock{}, c.Clock)
	assert.NotNil(t, c.Logger)

	l, err = idempotency.New(db, &idempotency.Config{SingleCaller: true, StoredHeaders: []string{"x-request-id"}})
	require.NoError(t, err)
	assert.Equal(t, []string{"X-Request-Id"}, l.Config().StoredHeaders)
}

// TestClosedDatabase checks that a closed database handle gives the one
// closed-database error shared with the other packages.
func TestClosedDatabase(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	require.NoError(t, sqlDB.Close())

	err = idempotency.Migrate(context.Background(), db)
	require.ErrorIs(t, err, idempotency.ErrClosed)
	require.ErrorIs(t, err, outbox.ErrClosed)
}
