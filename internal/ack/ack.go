// Package ack reads the settlement state of watermill messages, for the
// buses that hold several delivered messages and settle them in order.
package ack

import "github.com/ThreeDotsLabs/watermill/message"

// Acked reports, without waiting, whether msg has been acked.
func Acked(msg *message.Message) bool {
	select {
	case <-msg.Acked():
		return true
	default:
		return false
	}
}
