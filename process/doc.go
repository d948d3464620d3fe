// Package process runs process managers (sagas): long-running processes
// that coordinate work across aggregates and time, such as "cancel an
// order that is not paid within 15 minutes" or "retry the capture three
// times over an hour, then refund".
//
// A process's state is a GORM model that embeds [Base], keyed by tenant
// and a correlation key taken from each message (an order id, a payment
// id). A [Manager] runs one process type on a consumer.Consumer: messages
// registered with [StartedBy] start a process (or continue it), those
// registered with [Handles] continue a running one, and timeouts a step
// scheduled with [Step.Schedule] arrive at the steps registered with
// [OnTimeout]. A step changes the state, emits messages ([Step.Emit]),
// schedules and cancels timeouts, and may complete the process
// ([Step.Complete]).
//
// Each step runs in the consumer's inbox transaction of its message, so
// the state change, the emitted messages and the scheduled or cancelled
// timeouts commit exactly once with the inbox record, or not at all: a
// step that fails is retried as a whole. Steps of one process run one at a
// time when the consumer's group is partitioned by the correlation key;
// the state's Version is checked at every save as a safety net, and a
// step that lost a race fails with [ErrConflict] and is retried.
//
// The policies:
//   - a timeout is dropped on arrival unless it is still its process's
//     live timeout of its name (its token in [Base.Timeouts]): a cancel
//     that lost the race to the timeout's release is therefore harmless;
//   - a message for a completed process is dropped (the completed row
//     stays as a tombstone, so a late message never restarts it);
//   - a [Handles] message for a process that has not started is dropped,
//     or, with [Fail], failed and retried, then dead-lettered.
//
// Dropped messages are logged. Timeouts are scheduled messages
// (outbox.Store.Schedule) and inherit their guarantees; package bentotest's
// Env.Advance fires them deterministically in tests.
//
// Operators reach processes by their state table, without the model's Go
// type: [List] lists them and [Abandon] completes one stuck waiting for a
// message that will not come. The bento command (bento process list and
// abandon) and the console's Processes page are built on them.
package process
