package health

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/messaging"
)

// ErrBusBacklog is the error of a DatabaseBus check whose group has more
// ready messages than its limit.
var ErrBusBacklog = errors.New("health: the group's backlog is over its limit")

// DatabaseBus checks consumer group group on the database bus in db
// (package dbbus): it counts the group's ready and leased deliveries (over
// its partition queues when it is partitioned, with dbbus.Stats) and those
// of its dead-letter queue consumer.DeadLetterQueue(group), and fails with
// ErrBusBacklog when more than maxReady are ready (consumers that are
// stopped, stuck or too few), naming every count. It fails too when the
// group is not declared.
func DatabaseBus(db *gorm.DB, group string, maxReady int) Check {
	return Check{Name: "bus " + group, Run: func(ctx context.Context) error {
		st, err := dbbus.Stats(ctx, db, group)
		if err != nil {
			return err
		}
		if st.Ready <= maxReady {
			return nil
		}
		dead, err := dbbus.Stats(ctx, db, consumer.DeadLetterQueue(group))
		if err != nil && !errors.Is(err, messaging.ErrQueueNotFound) {
			return err
		}
		return fmt.Errorf("%w: %d ready (limit %d), %d leased, %d dead", ErrBusBacklog, st.Ready, maxReady, st.Leased, dead.Ready+dead.Leased)
	}}
}
