package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/uow"
)

// Widget is the aggregate the command handler creates.
type Widget struct {
	aggregate.Base
	Name string
}

func (*Widget) AggregateType() string { return "widget" }

// WidgetCreated is what creating a widget records.
type WidgetCreated struct {
	WidgetID string `json:"widget_id"`
	Name     string `json:"name"`
}

func (WidgetCreated) EventType() string { return "widget.created" }

// TestHandlerUnitOfWorkJoinsLedgerTransaction checks that a unit of work the
// handler runs with the request's context joins the ledger's transaction:
// after a 5xx neither the aggregate, nor its outbox event, nor the key
// exist; after success all three do, committed together.
func TestHandlerUnitOfWorkJoinsLedgerTransaction(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		require.NoError(t, outbox.Migrate(ctx, db))
		require.NoError(t, db.AutoMigrate(&Widget{}))
		e := setup(t, b, db, nil)
		woken := 0 // AfterCommit hooks run: only for a committed ledger transaction
		units, err := uow.New(db, &uow.Config{AfterCommit: func(n int) { woken += n }})
		require.NoError(t, err)

		calls := 0
		h := e.ledger.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls++
			err := units.Run(r.Context(), func(ctx context.Context, u *uow.UnitOfWork) error {
				assert.True(t, u.Joined(), "the unit joins the ledger's transaction")
				wd := &Widget{Name: "sprocket"}
				wd.ID = "w-1"
				wd.Record(WidgetCreated{WidgetID: wd.ID, Name: wd.Name})
				return u.Add(wd)
			})
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if calls == 1 { // the unit committed (its savepoint), then the command fails
				http.Error(w, "downstream unavailable", http.StatusBadGateway)
				return
			}
			w.Header().Set("Location", "/widgets/w-1")
			w.WriteHeader(http.StatusCreated)
		}))
		send := func() int {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, newRequest(http.MethodPost, "/widgets", "widget-key", `{"name":"sprocket"}`))
			return w.Code
		}
		count := func(model any) int64 {
			var n int64
			require.NoError(t, db.Model(model).Count(&n).Error)
			return n
		}

		require.Equal(t, http.StatusBadGateway, send())
		assert.Zero(t, count(&Widget{}), "no aggregate after a 5xx")
		assert.Zero(t, count(&outbox.Message{}), "no outbox event after a 5xx")
		assert.Zero(t, count(&idempotency.Record{}), "no key after a 5xx")
		assert.Zero(t, woken, "no AfterCommit hook for a rolled back request")

		require.Equal(t, http.StatusCreated, send())
		assert.Equal(t, int64(1), count(&Widget{}))
		var events []outbox.Message
		require.NoError(t, db.Find(&events).Error)
		require.Len(t, events, 1)
		assert.Equal(t, "widget.created", events[0].Topic)
		assert.Equal(t, "w-1", events[0].AggregateID)
		assert.Equal(t, "default", events[0].TenantID)
		rows := e.keys(t)
		require.Len(t, rows, 1)
		assert.Equal(t, idempotency.StateCompleted, rows[0].State)

		assert.Equal(t, 1, woken, "the hook ran once the ledger committed")

		require.Equal(t, http.StatusCreated, send(), "replayed")
		assert.Equal(t, 2, calls)
		assert.Equal(t, 1, woken, "a replay commits nothing new")
		assert.Equal(t, int64(1), count(&outbox.Message{}))
	})
}
