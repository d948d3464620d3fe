package outbox_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
)

// maxPayload is the small payload limit the validation tests configure.
const maxPayload = 64

// maxMetadata is the small metadata limit they configure.
const maxMetadata = 24

func TestAddRejectsInvalidEvents(t *testing.T) {
	t.Parallel()
	type withFunc struct {
		Name string
		F    func()
	}
	type withChan struct {
		C chan int
	}
	okPayload := orderPaid{OrderID: "o-1"}
	cases := []struct {
		name    string
		ctx     func(context.Context) context.Context
		topic   string
		payload any
		opts    *outbox.AddOpts
		want    error
		field   string
		cause   bool // the error also carries json.UnsupportedTypeError
	}{
		{name: "empty topic", topic: "", want: outbox.ErrInvalidEvent, field: "topic"},
		{name: "topic with *", topic: "order.*", want: outbox.ErrInvalidEvent, field: "topic"},
		{name: "topic with #", topic: "order.#", want: outbox.ErrInvalidEvent, field: "topic"},
		{name: "topic with spaces", topic: "order paid", want: outbox.ErrInvalidEvent, field: "topic"},
		{name: "topic with empty word", topic: "order..paid", want: outbox.ErrInvalidEvent, field: "topic"},
		{name: "topic over 100 chars", topic: strings.Repeat("a", outbox.MaxTopicLen+1), want: outbox.ErrInvalidEvent, field: "topic"},
		{name: "tenant with space and bang", opts: &outbox.AddOpts{Tenant: "bad tenant!"}, want: tenant.ErrInvalid, field: "tenant_id"},
		{name: "tenant of 33 chars", opts: &outbox.AddOpts{Tenant: strings.Repeat("t", tenant.MaxLen+1)}, want: tenant.ErrInvalid, field: "tenant_id"},
		{
			name: "bad tenant in context",
			ctx:  func(ctx context.Context) context.Context { return tenant.With(ctx, "bad tenant!") },
			want: tenant.ErrInvalid, field: "tenant_id",
		},
		{name: "aggregate id without type", opts: &outbox.AddOpts{AggregateID: "o-1"}, want: outbox.ErrInvalidEvent, field: "aggregate_type"},
		{name: "aggregate type without id", opts: &outbox.AddOpts{AggregateType: "order"}, want: outbox.ErrInvalidEvent, field: "aggregate_id"},
		{name: "aggregate type starting with a digit", opts: &outbox.AddOpts{AggregateType: "1order", AggregateID: "o-1"}, want: outbox.ErrInvalidEvent, field: "aggregate_type"},
		{name: "aggregate id with control char", opts: &outbox.AddOpts{AggregateType: "order", AggregateID: "o\n1"}, want: outbox.ErrInvalidEvent, field: "aggregate_id"},
		{name: "negative aggregate version", opts: &outbox.AddOpts{AggregateType: "order", AggregateID: "o-1", AggregateVersion: -1}, want: outbox.ErrInvalidEvent, field: "aggregate_version"},
		{name: "schema version 40000", opts: &outbox.AddOpts{SchemaVersion: 40000}, want: outbox.ErrInvalidEvent, field: "schema_version"},
		{name: "negative schema version", opts: &outbox.AddOpts{SchemaVersion: -1}, want: outbox.ErrInvalidEvent, field: "schema_version"},
		{name: "payload not JSON", payload: []byte("{"), want: outbox.ErrInvalidEvent, field: "payload"},
		{name: "payload empty bytes", payload: []byte{}, want: outbox.ErrInvalidEvent, field: "payload"},
		{name: "payload nil", payload: nil, want: outbox.ErrInvalidEvent, field: "payload"},
		{name: "payload with func field", payload: withFunc{Name: "x", F: func() {}}, want: outbox.ErrInvalidEvent, field: "payload", cause: true},
		{name: "payload with chan field", payload: withChan{C: make(chan int)}, want: outbox.ErrInvalidEvent, field: "payload", cause: true},
		{
			name:    "payload too large",
			payload: map[string]string{"data": strings.Repeat("x", maxPayload)},
			want:    outbox.ErrPayloadTooLarge, field: "payload",
		},
		{name: "dedup key with control char", opts: &outbox.AddOpts{DedupKey: "key\x01"}, want: outbox.ErrInvalidEvent, field: "dedup_key"},
		{name: "dedup key too long", opts: &outbox.AddOpts{DedupKey: strings.Repeat("k", outbox.MaxDedupKeyLen+1)}, want: outbox.ErrInvalidEvent, field: "dedup_key"},
		{
			name: "metadata key over 255 bytes", opts: &outbox.AddOpts{Metadata: outbox.Metadata{strings.Repeat("k", outbox.MaxMetadataKeyLen+1): "v"}},
			want: outbox.ErrInvalidEvent, field: "metadata",
		},
		{
			// Two entries of 3+3+6 bytes each fit in 24 bytes; a third does not.
			name: "metadata too large", opts: &outbox.AddOpts{Metadata: outbox.Metadata{"k01": "v01", "k02": "v02", "k03": "v03"}},
			want: outbox.ErrMetadataTooLarge, field: "metadata",
		},
		{name: "empty metadata key", opts: &outbox.AddOpts{Metadata: outbox.Metadata{"": "v"}}, want: outbox.ErrInvalidEvent, field: "metadata"},
		{
			name: "empty metadata key in context",
			ctx:  func(ctx context.Context) context.Context { return outbox.WithMetadata(ctx, outbox.Metadata{"": "v"}) },
			want: outbox.ErrInvalidEvent, field: "metadata",
		},
	}
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, &outbox.Config{MaxPayloadBytes: maxPayload, MaxMetadataBytes: maxMetadata})
		// One valid row, so "unchanged" is not just "still empty".
		e.add(context.Background(), t, "order.paid", okPayload, nil)

		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				ctx := context.Background()
				if c.ctx != nil {
					ctx = c.ctx(ctx)
				}
				// Cases leave unset what they do not test.
				topic, payload := c.topic, c.payload
				if topic == "" && c.field != "topic" {
					topic = "order.paid"
				}
				if payload == nil && c.field != "payload" {
					payload = okPayload
				}
				before := countRows(t, db, "")

				tx := begin(t, db)
				m, err := e.store.Add(ctx, tx, topic, payload, c.opts)
				require.ErrorIs(t, err, c.want)
				assert.Nil(t, m)
				var ve *outbox.ValidationError
				require.ErrorAs(t, err, &ve)
				assert.Equal(t, c.field, ve.Field)
				assert.ErrorIs(t, ve, c.want, "ValidationError unwraps to the sentinel")
				if c.cause {
					var ute *json.UnsupportedTypeError
					assert.ErrorAs(t, err, &ute, "the encoder's error is kept")
				}
				// Commit what the transaction holds: nothing may have been written.
				require.NoError(t, tx.Commit().Error)

				assert.Equal(t, before, countRows(t, db, ""), "table unchanged")
			})
		}
	})
}

func TestAddAcceptsLimits(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, &outbox.Config{MaxPayloadBytes: maxPayload, MaxMetadataBytes: maxMetadata})
		ctx := context.Background()
		payload := []byte(`"` + strings.Repeat("x", maxPayload-2) + `"`)
		require.Len(t, payload, maxPayload)
		topic := strings.Repeat("a", outbox.MaxTopicLen)
		tid := strings.Repeat("t", tenant.MaxLen)

		m := e.add(ctx, t, topic, payload, &outbox.AddOpts{
			Tenant:           tid,
			DedupKey:         strings.Repeat("k", outbox.MaxDedupKeyLen),
			AggregateType:    "o" + strings.Repeat("r", outbox.MaxAggregateTypeLen-1),
			AggregateID:      strings.Repeat("i", outbox.MaxAggregateIDLen),
			AggregateVersion: 1 << 40,
			SchemaVersion:    32767,
		})
		got, err := e.store.Get(ctx, m.ID)
		require.NoError(t, err)
		assert.Equal(t, topic, got.Topic)
		assert.Equal(t, tid, got.TenantID)
		assert.Equal(t, 32767, got.SchemaVersion)
		assert.Equal(t, int64(1<<40), got.AggregateVersion)
		assert.JSONEq(t, string(payload), string(got.Payload))
	})
}

func TestValidateTopic(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"order", "order.paid", "a-b_c.D9", strings.Repeat("a", outbox.MaxTopicLen)} {
		assert.NoError(t, outbox.ValidateTopic(ok), ok)
	}
	for _, bad := range []string{"", ".order", "order.", "order..paid", "order.*", "order.#", "order paid", "ordér", strings.Repeat("a", outbox.MaxTopicLen+1)} {
		err := outbox.ValidateTopic(bad)
		require.ErrorIs(t, err, outbox.ErrInvalidEvent, bad)
		var ve *outbox.ValidationError
		require.ErrorAs(t, err, &ve, bad)
		assert.Equal(t, "topic", ve.Field, bad)
	}
}

func TestValidateAggregateType(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"order", "Order.Line-item_2", strings.Repeat("a", outbox.MaxAggregateTypeLen)} {
		assert.NoError(t, outbox.ValidateAggregateType(ok), ok)
	}
	for _, bad := range []string{"", "1order", "_order", "order line", strings.Repeat("a", outbox.MaxAggregateTypeLen+1)} {
		err := outbox.ValidateAggregateType(bad)
		require.ErrorIs(t, err, outbox.ErrInvalidEvent, bad)
		var ve *outbox.ValidationError
		require.ErrorAs(t, err, &ve, bad)
		assert.Equal(t, "aggregate_type", ve.Field, bad)
	}
}
