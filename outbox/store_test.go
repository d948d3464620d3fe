package outbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
)

func TestAddWritesRowWithDefaults(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()

		tx := begin(t, db)
		m, err := e.store.Add(ctx, tx, "order.paid", orderPaid{OrderID: "o-1", Amount: 1250}, nil)
		require.NoError(t, err)
		require.NoError(t, tx.Commit().Error)

		id, err := ulid.ParseStrict(m.ID)
		require.NoError(t, err, "Message.ID is a ULID")
		assert.Equal(t, ulid.Timestamp(epoch), id.Time(), "ULID time is the stamper's")

		got, err := e.store.Get(ctx, m.ID)
		require.NoError(t, err)
		assert.Equal(t, m.ID, got.ID)
		assert.Equal(t, tenant.Default, got.TenantID)
		assert.Equal(t, "order.paid", got.Topic)
		assert.Equal(t, "", got.AggregateType)
		assert.Equal(t, "", got.AggregateID)
		assert.Equal(t, int64(0), got.AggregateVersion)
		assert.Equal(t, 1, got.SchemaVersion)
		assert.JSONEq(t, `{"order_id":"o-1","amount":1250}`, string(got.Payload))
		assert.Empty(t, got.Metadata)
		assert.Equal(t, outbox.StatusNew, got.Status)
		assert.Equal(t, 0, got.Attempts)
		assertTime(t, epoch, got.OccurredAt, "occurred_at")
		assertTime(t, epoch, got.CreatedAt, "created_at")
		assertTime(t, epoch, got.AvailableAt, "available_at")
		assert.Nil(t, got.LockedBy)
		assert.Nil(t, got.LockedUntil)
		assert.Nil(t, got.LastError)
		assert.Nil(t, got.PublishedAt)
		assert.Nil(t, got.DedupKey)

		// The returned message says what was written.
		assert.Equal(t, outbox.StatusNew, m.Status)
		assert.Equal(t, tenant.Default, m.TenantID)
		assert.Equal(t, 1, m.SchemaVersion)
		assertTime(t, epoch, m.CreatedAt, "returned created_at")

		assert.Equal(t, int64(1), countRows(t, db, ""))
		assert.Equal(t, int64(1), countRows(t, db, "id = ?", m.ID))
	})
}

func TestAddStoresOptions(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		occurred := epoch.Add(-90 * time.Minute).In(time.FixedZone("CET", 3600))
		e.stamper.Advance(time.Second)

		m := e.add(ctx, t, "order.paid", orderPaid{OrderID: "o-7"}, &outbox.AddOpts{
			Tenant:           "acme",
			DedupKey:         "order-7-paid",
			AggregateType:    "order",
			AggregateID:      "o-7",
			AggregateVersion: 3,
			SchemaVersion:    2,
			Metadata:         outbox.Metadata{messaging.MetaProducer: "shop"},
			OccurredAt:       occurred,
		})

		got, err := e.store.Get(ctx, m.ID)
		require.NoError(t, err)
		assert.Equal(t, "acme", got.TenantID)
		assert.Equal(t, "order", got.AggregateType)
		assert.Equal(t, "o-7", got.AggregateID)
		assert.Equal(t, int64(3), got.AggregateVersion)
		assert.Equal(t, 2, got.SchemaVersion)
		assert.Equal(t, outbox.Metadata{messaging.MetaProducer: "shop"}, got.Metadata)
		require.NotNil(t, got.DedupKey)
		assert.Equal(t, "order-7-paid", *got.DedupKey)
		assertTime(t, occurred, got.OccurredAt, "occurred_at")
		assertTime(t, epoch.Add(time.Second), got.CreatedAt, "created_at")
		assertTime(t, epoch.Add(time.Second), got.AvailableAt, "available_at")
	})
}

func TestAddPayloadForms(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		cases := []struct {
			name    string
			payload any
			want    string
		}{
			{"struct", orderPaid{OrderID: "o-1", Amount: 5}, `{"order_id":"o-1","amount":5}`},
			{"pointer to struct", &orderPaid{OrderID: "o-2", Amount: 6}, `{"order_id":"o-2","amount":6}`},
			{"map", map[string]int{"n": 1}, `{"n":1}`},
			{"json.RawMessage", json.RawMessage(`{"order_id":"o-3","amount":7}`), `{"order_id":"o-3","amount":7}`},
			{"[]byte", []byte(`[1, 2, 3]`), `[1,2,3]`},
			{"outbox.JSON", outbox.JSON(`"text"`), `"text"`},
			{"string", "hello", `"hello"`},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				m := e.add(ctx, t, "order.paid", c.payload, nil)
				assert.JSONEq(t, c.want, string(m.Payload), "returned payload")
				got, err := e.store.Get(ctx, m.ID)
				require.NoError(t, err)
				assert.JSONEq(t, c.want, string(got.Payload), "stored payload")
			})
		}
		assert.Equal(t, int64(len(cases)), countRows(t, db, ""))
	})
}

func TestAddRollbackLeavesNothing(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()

		tx := begin(t, db)
		m, err := e.store.Add(ctx, tx, "order.paid", orderPaid{OrderID: "o-1"}, &outbox.AddOpts{DedupKey: "k-1"})
		require.NoError(t, err)
		require.Equal(t, int64(1), countRows(t, tx, ""), "row visible inside the transaction")
		require.NoError(t, tx.Rollback().Error)

		assert.Equal(t, int64(0), countRows(t, db, ""))
		_, err = e.store.Get(ctx, m.ID)
		require.ErrorIs(t, err, gorm.ErrRecordNotFound)

		// The rolled-back dedup key is free again.
		e.add(ctx, t, "order.paid", orderPaid{OrderID: "o-1"}, &outbox.AddOpts{DedupKey: "k-1"})
		assert.Equal(t, int64(1), countRows(t, db, "dedup_key = ?", "k-1"))
	})
}

func TestAddTenantFromContext(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		acme := tenant.With(context.Background(), "acme")

		fromCtx := e.add(acme, t, "order.paid", orderPaid{OrderID: "o-1"}, nil)
		explicit := e.add(acme, t, "order.paid", orderPaid{OrderID: "o-2"}, &outbox.AddOpts{Tenant: "globex"})
		none := e.add(context.Background(), t, "order.paid", orderPaid{OrderID: "o-3"}, nil)

		for _, c := range []struct {
			m    *outbox.Message
			want string
		}{{fromCtx, "acme"}, {explicit, "globex"}, {none, tenant.Default}} {
			assert.Equal(t, c.want, c.m.TenantID, "returned tenant")
			got, err := e.store.Get(context.Background(), c.m.ID)
			require.NoError(t, err)
			assert.Equal(t, c.want, got.TenantID, "stored tenant")
		}
		assert.Equal(t, int64(1), countRows(t, db, "tenant_id = ?", "acme"))
		assert.Equal(t, int64(1), countRows(t, db, "tenant_id = ?", "globex"))
		assert.Equal(t, int64(1), countRows(t, db, "tenant_id = ?", tenant.Default))
	})
}

func TestAddMetadata(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		base := context.Background()
		outerMD := outbox.Metadata{messaging.MetaCorrelationID: "corr-1", messaging.MetaProducer: "outer"}
		outer := outbox.WithMetadata(base, outerMD)
		inner := outbox.WithMetadata(outer, outbox.Metadata{messaging.MetaProducer: "inner", messaging.MetaTraceparent: "tp-ctx"})
		outerMD[messaging.MetaProducer] = "changed after WithMetadata" // the context holds a copy

		cases := []struct {
			name string
			ctx  context.Context
			md   outbox.Metadata
			want outbox.Metadata
		}{
			{
				name: "none",
				ctx:  base,
				want: outbox.Metadata{},
			},
			{
				name: "context",
				ctx:  outer,
				want: outbox.Metadata{messaging.MetaCorrelationID: "corr-1", messaging.MetaProducer: "outer"},
			},
			{
				name: "nested context, inner wins",
				ctx:  inner,
				want: outbox.Metadata{messaging.MetaCorrelationID: "corr-1", messaging.MetaProducer: "inner", messaging.MetaTraceparent: "tp-ctx"},
			},
			{
				name: "per-add wins over context",
				ctx:  inner,
				md:   outbox.Metadata{messaging.MetaTraceparent: "tp-own", "custom": "x"},
				want: outbox.Metadata{
					messaging.MetaCorrelationID: "corr-1", messaging.MetaProducer: "inner",
					messaging.MetaTraceparent: "tp-own", "custom": "x",
				},
			},
			{
				name: "per-add only",
				ctx:  base,
				md:   outbox.Metadata{messaging.MetaCausationID: "cause-1"},
				want: outbox.Metadata{messaging.MetaCausationID: "cause-1"},
			},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				m := e.add(c.ctx, t, "order.paid", orderPaid{OrderID: "o-1"}, &outbox.AddOpts{Metadata: c.md})
				got, err := e.store.Get(base, m.ID)
				require.NoError(t, err)
				if len(c.want) == 0 {
					assert.Empty(t, got.Metadata)
				} else {
					assert.Equal(t, c.want, got.Metadata)
				}
			})
		}
		assert.Equal(t, "outer", outbox.MetadataFrom(outer)[messaging.MetaProducer], "nesting leaves the outer context alone")
		assert.Nil(t, outbox.MetadataFrom(base))
	})
}

func TestGetMissing(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		_, err := e.store.Get(context.Background(), aggregate.NewID())
		require.ErrorIs(t, err, gorm.ErrRecordNotFound)
	})
}

func TestInsertBatch(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		now := e.stamper.Now()
		msgs := []*outbox.Message{
			{ID: e.stamper.NewID(now), Topic: "order.placed", Payload: outbox.JSON(`{"n":1}`)},
			{ID: e.stamper.NewID(now), Topic: "order.paid", Payload: outbox.JSON(`{"n":2}`), TenantID: "acme"},
		}
		tx := begin(t, db)
		require.NoError(t, e.store.Insert(ctx, tx, msgs))
		require.NoError(t, tx.Commit().Error)

		assert.Equal(t, int64(2), countRows(t, db, "status = ?", string(outbox.StatusNew)))
		assert.Equal(t, int64(1), countRows(t, db, "tenant_id = ?", "acme"))

		require.NoError(t, e.store.Insert(ctx, db, nil), "an empty batch is a no-op")
		require.Error(t, e.store.Insert(ctx, nil, []*outbox.Message{
			{ID: e.stamper.NewID(now), Topic: "order.paid", Payload: outbox.JSON(`{}`)},
		}), "nil transaction")
		assert.Equal(t, int64(2), countRows(t, db, ""))
	})
}

func TestInsertValidatesWholeBatchFirst(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		now := e.stamper.Now()
		cases := []struct {
			name  string
			msgs  []*outbox.Message
			field string
		}{
			{"id not a ULID", []*outbox.Message{
				{ID: e.stamper.NewID(now), Topic: "order.paid", Payload: outbox.JSON(`{}`)},
				{ID: "not-a-ulid", Topic: "order.paid", Payload: outbox.JSON(`{}`)},
			}, "id"},
			{"metadata with empty key", []*outbox.Message{
				{ID: e.stamper.NewID(now), Topic: "order.paid", Payload: outbox.JSON(`{}`)},
				{ID: e.stamper.NewID(now), Topic: "order.paid", Payload: outbox.JSON(`{}`), Metadata: outbox.Metadata{"": "v"}},
			}, "metadata"},
			{"bad tenant", []*outbox.Message{
				{ID: e.stamper.NewID(now), Topic: "order.paid", Payload: outbox.JSON(`{}`)},
				{ID: e.stamper.NewID(now), Topic: "order.paid", Payload: outbox.JSON(`{}`), TenantID: "no spaces"},
			}, "tenant_id"},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				tx := begin(t, db)
				err := e.store.Insert(ctx, tx, c.msgs)
				require.Error(t, err)
				var ve *outbox.ValidationError
				require.ErrorAs(t, err, &ve)
				assert.Equal(t, c.field, ve.Field)
				require.NoError(t, tx.Commit().Error)
				assert.Equal(t, int64(0), countRows(t, db, ""), "the valid first message is not written either")
			})
		}
	})
}

func TestClosedDatabase(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		m := e.add(ctx, t, "order.paid", orderPaid{OrderID: "o-1"}, nil)

		sqlDB, err := db.DB()
		require.NoError(t, err)
		require.NoError(t, sqlDB.Close())

		_, err = e.store.Add(ctx, db, "order.paid", orderPaid{OrderID: "o-2"}, nil)
		require.ErrorIs(t, err, outbox.ErrClosed, "Add")
		_, err = e.store.Stats(ctx, nil)
		require.ErrorIs(t, err, outbox.ErrClosed, "Stats")
		_, err = e.store.Get(ctx, m.ID)
		require.ErrorIs(t, err, outbox.ErrClosed, "Get")
		err = outbox.Migrate(ctx, db)
		require.ErrorIs(t, err, outbox.ErrClosed, "Migrate")
	})
}

func TestNewStoreConfig(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	require.NoError(t, outbox.Migrate(context.Background(), db))

	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		for _, cfg := range []*outbox.Config{nil, {}} {
			s, err := outbox.NewStore(db, cfg)
			require.NoError(t, err)
			assert.Equal(t, outbox.DefaultMaxPayloadBytes, s.Config().MaxPayloadBytes)
			assert.Equal(t, outbox.DefaultMaxMetadataBytes, s.Config().MaxMetadataBytes)
			assert.Equal(t, aggregate.SystemClock{}, s.Config().Clock)
			assert.Same(t, db, s.DB())
		}
	})
	t.Run("custom", func(t *testing.T) {
		t.Parallel()
		st := testenv.NewClock(epoch)
		s, err := outbox.NewStore(db, &outbox.Config{MaxPayloadBytes: 64, Clock: st})
		require.NoError(t, err)
		assert.Equal(t, 64, s.Config().MaxPayloadBytes)
		assert.Same(t, st, s.Config().Clock)
	})
	t.Run("negative MaxPayloadBytes", func(t *testing.T) {
		t.Parallel()
		s, err := outbox.NewStore(db, &outbox.Config{MaxPayloadBytes: -1})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		require.ErrorContains(t, err, "MaxPayloadBytes:")
		assert.Nil(t, s)
	})
	t.Run("negative MaxMetadataBytes", func(t *testing.T) {
		t.Parallel()
		s, err := outbox.NewStore(db, &outbox.Config{MaxMetadataBytes: -1})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		require.ErrorContains(t, err, "MaxMetadataBytes:")
		assert.Nil(t, s)
	})
	t.Run("nil db", func(t *testing.T) {
		t.Parallel()
		s, err := outbox.NewStore(nil, nil)
		require.ErrorIs(t, err, dialect.ErrUnsupported)
		assert.Nil(t, s)
	})
	t.Run("unsupported dialect", func(t *testing.T) {
		t.Parallel()
		s, err := outbox.NewStore(otherDB(), nil)
		require.ErrorIs(t, err, dialect.ErrUnsupported)
		assert.Nil(t, s)
	})
}
