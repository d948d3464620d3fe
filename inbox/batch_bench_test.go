package inbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/uow"
)

// BenchmarkApplyBatch measures, on PostgreSQL, what one message costs the
// inbox with a handler that inserts one row and version watermarks on:
// one transaction per message (Middleware), one per 100 messages
// (ApplyBatch), and one per 100 with a SAVEPOINT before each handler, the
// round trip a savepoint per handler would add to isolate a failing one.
// With "fail", the 50th message of each batch fails: ApplyBatch rolls back
// and applies the 49 before it again, where savepoints would roll back to
// the last one. It reports msg/s; compare them in one run:
//
//	go test ./inbox -run '^$' -bench ApplyBatch -benchtime 5x
func BenchmarkApplyBatch(b *testing.B) {
	const batch, aggregates = 100, 10
	savepoint := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if err := uow.DB(msg.Context(), nil).Exec("SAVEPOINT handler").Error; err != nil {
				return nil, err
			}
			return h(msg)
		}
	}
	failing := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if msg.Metadata.Get("fail") != "" {
				return nil, fmt.Errorf("fails")
			}
			return h(msg)
		}
	}
	for _, tc := range []struct {
		name  string
		batch int
		wrap  func(message.HandlerFunc) message.HandlerFunc
		fail  bool
	}{
		{"per-message", 1, nil, false},
		{"batch=100", batch, nil, false},
		{"batch=100+savepoints", batch, savepoint, false},
		{"batch=100/fail", batch, nil, true},
		{"batch=100+savepoints/fail", batch, savepoint, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			db, _ := testenv.Postgres(b)
			e := setup(b, db, "bench")
			in := withVersions(b, e.db, "bench", inbox.VersionsIncreasing)
			h := message.HandlerFunc(writeApplied)
			if tc.wrap != nil {
				h = tc.wrap(h)
			}
			h = failing(h)
			ctx := context.Background()
			version := map[string]int64{}
			next := func(i int) *message.Message {
				cart := fmt.Sprintf("c%d", i%aggregates)
				version[cart]++
				return versionMsg(fmt.Sprintf("m%d-%d", b.N, i), cart, version[cart])
			}
			applied := 0
			b.ResetTimer()
			for i := 0; applied < b.N*batch; {
				msgs := make([]*message.Message, 0, tc.batch)
				for range tc.batch {
					msgs = append(msgs, next(i))
					i++
				}
				if tc.fail {
					msgs[len(msgs)/2].Metadata.Set("fail", "1")
				}
				for len(msgs) > 0 {
					var n int
					var err error
					if tc.batch == 1 {
						_, err = in.Middleware(h)(msgs[0])
						if err == nil {
							n = 1
						}
					} else {
						n, err = in.ApplyBatch(ctx, msgs, h)
					}
					applied += n
					msgs = msgs[n:]
					if err != nil {
						delete(msgs[0].Metadata, "fail") // fixed: redelivered, it applies
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(applied)/b.Elapsed().Seconds(), "msg/s")
			var rows int64
			require.NoError(b, e.db.Model(&Applied{}).Count(&rows).Error)
			require.EqualValues(b, applied, rows, "each message applied once")
		})
	}
}
