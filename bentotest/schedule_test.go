package bentotest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/uow"
)

// Reminder is a message the tests schedule.
type Reminder struct {
	AccountID string `json:"account_id"`
	N         int    `json:"n"`
}

func (Reminder) EventType() string { return "account.reminder" }

// TestAdvanceFiresWhatIsDue: scheduled messages fire only when the test
// moves the clock past their due time, first due first, and a handler's
// own schedule fires on a later Advance; a cancelled one never fires.
func TestAdvanceFiresWhatIsDue(t *testing.T) {
	env := open(t)
	env.Migrate(t, &Ledger{})
	c := env.MustConsumer(t, "reminders")
	require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, r Reminder, m *messaging.Envelope) error {
		if err := tx.Create(&Ledger{EventID: m.ID, Kind: fmt.Sprint("reminder-", r.N)}).Error; err != nil {
			return err
		}
		if r.N == 1 { // the first reminder schedules a follow-up a day later
			_, err := env.Outbox.Schedule(ctx, tx, Reminder{}.EventType(), Reminder{AccountID: r.AccountID, N: 9},
				outbox.After(24*time.Hour), nil)
			return err
		}
		return nil
	}))
	env.Start(t, c)

	ctx := context.Background()
	require.NoError(t, env.Units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
		for i, d := range []time.Duration{3 * time.Hour, time.Hour, 2 * time.Hour} {
			if _, err := u.Schedule(ctx, Reminder{}.EventType(), Reminder{AccountID: "acc-1", N: i + 1}, outbox.After(d),
				&outbox.ScheduleOpts{Key: fmt.Sprint("r-", i+1)}); err != nil {
				return err
			}
		}
		_, err := u.Schedule(ctx, Reminder{}.EventType(), Reminder{N: 99}, outbox.After(90*time.Minute), &outbox.ScheduleOpts{Key: "gone"})
		return err
	}))
	require.NoError(t, env.Units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
		_, err := u.Cancel(ctx, "gone")
		return err
	}))
	assert.Len(t, env.Scheduled(t), 3)

	kinds := func() []string {
		var ls []Ledger
		require.NoError(t, env.DB.Order("rowid").Find(&ls).Error) // in the order handled
		out := []string{}
		for _, l := range ls {
			out = append(out, l.Kind)
		}
		return out
	}
	assert.Equal(t, 0, env.Drain(t).Published, "nothing due yet")
	assert.Equal(t, 0, env.Advance(t, time.Hour-time.Second).Published, "a second early")
	assert.Equal(t, 1, env.Advance(t, time.Second).Published)
	assert.Equal(t, []string{"reminder-2"}, kinds())
	assert.Equal(t, 2, env.Advance(t, 3*time.Hour).Published, "the two others, and not the cancelled one")
	assert.Equal(t, []string{"reminder-2", "reminder-3", "reminder-1"}, kinds(), "in due order")
	require.Len(t, env.Scheduled(t), 1, "the follow-up the first reminder scheduled")
	assert.Equal(t, 1, env.Advance(t, 24*time.Hour).Published)
	assert.Equal(t, []string{"reminder-2", "reminder-3", "reminder-1", "reminder-9"}, kinds())
	assert.Empty(t, env.Scheduled(t))
}
