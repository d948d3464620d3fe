package console_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/console"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/rabbitmq"
)

// parkedStep is the event of the parked-page tests' consumer.
type parkedStep struct {
	N int64 `json:"n"`
}

func (parkedStep) EventType() string { return "console.step" }

// TestParkedPagesReleaseAHeldAggregate: a running partitioned consumer
// dead-letters version 2 of tenant acme's and tenant globex's order o1 and
// parks their version 3. On a console locked to acme, the group's parked
// page lists acme's parked event and hold only, globex's aggregate answers
// 404 and cannot be released, and Release on acme's aggregate page lets
// the consumer apply acme's version 3; globex's stays parked. The members
// page shows the consumer owning every partition.
func TestParkedPagesReleaseAHeldAggregate(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	ctx := t.Context()
	require.NoError(t, outbox.Migrate(ctx, db))
	require.NoError(t, inbox.Migrate(ctx, db))
	bus := messaging.NewMemoryBus()
	t.Cleanup(func() { _ = bus.Close() })
	const group = "parked-console"
	cfg := consumer.DefaultConfig(group)
	cfg.Partitions = 2
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.RetryInitialInterval, cfg.RetryMaxInterval = 5*time.Millisecond, 20*time.Millisecond
	c, err := consumer.NewMemory(db, bus, cfg)
	require.NoError(t, err)
	var mu sync.Mutex
	var applied []string
	require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e parkedStep, env *messaging.Envelope) error {
		if env.AggregateVersion == 2 {
			return consumer.Permanent(errors.New("version 2 cannot be applied"))
		}
		mu.Lock()
		defer mu.Unlock()
		applied = append(applied, fmt.Sprintf("%s/%d", env.TenantID, env.AggregateVersion))
		return nil
	}))
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	<-c.Running()
	for _, tid := range []string{"acme", "globex"} {
		for v := int64(1); v <= 3; v++ {
			m, err := messaging.NewMessage(&outbox.Message{ID: fmt.Sprintf("%s-o1-%d", tid, v), TenantID: tid,
				Topic: parkedStep{}.EventType(), AggregateType: "order", AggregateID: "o1", AggregateVersion: v,
				SchemaVersion: 1, Payload: []byte(fmt.Sprintf(`{"n":%d}`, v)), OccurredAt: time.Now().UTC()})
			require.NoError(t, err)
			require.NoError(t, bus.Publish(parkedStep{}.EventType(), m))
		}
	}
	parkedIDs := func() []string {
		ps, err := c.Parked(ctx, 10)
		require.NoError(t, err)
		var ids []string
		for _, p := range ps {
			ids = append(ids, p.MessageID)
		}
		slices.Sort(ids)
		return ids
	}
	testenv.WaitFor(t, 20*time.Second, "both aggregates' version 3 parked", func() bool {
		return slices.Equal(parkedIDs(), []string{"acme-o1-3", "globex-o1-3"})
	})

	e := setup(t, db, &console.Config{Tenant: "acme",
		Consumers: &console.Consumers{AMQP: &rabbitmq.Config{URL: "amqp://127.0.0.1:1/"}, Groups: []string{group}}})
	res, body := e.get(t, "/consumers/"+group+"/parked?tenant=globex")
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	assert.Contains(t, body, `data-id="acme-o1-3"`)
	assert.Contains(t, body, `data-id="acme-o1-2"`, "acme's hold")
	assert.NotContains(t, body, "globex-o1")
	assert.Contains(t, body, "parked/aggregate?tenant=acme&amp;type=order&amp;id=o1")

	res, body = e.get(t, "/consumers/"+group+"/parked/aggregate?tenant=globex&type=order&id=o1")
	assert.Equal(t, http.StatusNotFound, res.StatusCode)
	assert.NotContains(t, body, "globex-o1")
	res, body = e.get(t, "/consumers/"+group+"/parked/aggregate?tenant=acme&type=order&id=o1")
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	assert.Contains(t, body, `dead letter <span class="mono">acme-o1-2</span> (version 2)`)
	assert.Contains(t, body, `name="message_id" value="acme-o1-2"`)
	tok := tokenRE.FindStringSubmatch(body)
	require.NotNil(t, tok)

	release := func(tenantID, id string, confirm bool) (*http.Response, string) {
		form := url.Values{"csrf_token": {tok[1]}, "tenant": {tenantID}, "type": {"order"}, "id": {"o1"}, "message_id": {id}}
		if confirm {
			form.Set("confirm", "yes")
		}
		return e.post(t, "/consumers/"+group+"/parked/release", form, nil)
	}
	res, _ = release("globex", "globex-o1-2", true)
	assert.Equal(t, http.StatusNotFound, res.StatusCode, "another tenant's aggregate")
	res, _ = release("acme", "acme-o1-2", false)
	assert.Equal(t, http.StatusBadRequest, res.StatusCode, "unconfirmed")
	res, _ = release("acme", "acme-o1-9", true)
	assert.Equal(t, http.StatusConflict, res.StatusCode, "not what the aggregate is held behind")
	res, _ = release("acme", "acme-o1-2", true)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	assert.Equal(t, "../../../consumers/"+group+"/parked?done=released", res.Header.Get("Location"))
	_, body = e.follow(t, res)
	assert.Contains(t, body, `id="flash"`)

	testenv.WaitFor(t, 20*time.Second, "acme's version 3 applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(applied, "acme/3")
	})
	testenv.WaitFor(t, 10*time.Second, "acme's parked row gone", func() bool {
		return slices.Equal(parkedIDs(), []string{"globex-o1-3"})
	})
	mu.Lock()
	assert.NotContains(t, applied, "globex/3", "globex's aggregate is still held")
	mu.Unlock()
	_, body = e.get(t, "/consumers/"+group+"/parked")
	assert.Contains(t, body, `id="parked-empty"`)
	res, _ = e.get(t, "/consumers/"+group+"/parked/aggregate?tenant=acme&type=order&id=o1")
	assert.Equal(t, http.StatusNotFound, res.StatusCode, "nothing left of acme's")

	res, body = e.get(t, "/consumers/"+group+"/members")
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	assert.Regexp(t, `<td data-field="owns">0,1</td>`, body, "the one instance owns both partitions")
	assert.Contains(t, body, `<span class="count" id="members-total">1</span>`)
}
