//go:build bento_putback

package consumer

import "os"

// putBack names a fix to undo, from BENTO_PUTBACK, in test binaries built
// with the bento_putback tag, so that the fault campaign can be shown to
// find the bug each fix removed:
//   - "fence": a partitioned consumer's transactions commit without
//     checking that its membership is still live;
//   - "dbbus-crashes": the crash ledger ignores the database bus's
//     redeliveries, so a handler that kills its process loops forever;
//   - "delivery-limit": poison is counted by the broker's delivery limit
//     alone (20 deliveries, no crash ledger), so every give-back (a crash,
//     a move, a lost link) spends a delivery of every message a
//     subscription held, healthy or not.
var putBack = os.Getenv("BENTO_PUTBACK")
