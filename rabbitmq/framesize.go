package rabbitmq

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Sizes of the AMQP 0-9-1 encoding, as amqp091 writes them.
const (
	frameOverhead = 1 + 2 + 4 + 1 // type, channel, payload size, frame end
	// contentHeaderFixed is the content header payload before the
	// properties: class, weight, body size, property flags.
	contentHeaderFixed = 2 + 2 + 8 + 2
)

// headerFrameSize returns the size of the content header frame that carries
// pub's properties and headers: unlike the body, which is split over as
// many frames as it needs, it must fit one frame, whose limit the broker
// sets (frame_max). It follows amqp091's headerFrame.write.
func headerFrameSize(pub *amqp.Publishing) int {
	n := frameOverhead + contentHeaderFixed
	short := func(s string) {
		if s != "" {
			n += 1 + len(s)
		}
	}
	short(pub.ContentType)
	short(pub.ContentEncoding)
	if len(pub.Headers) > 0 {
		n += tableSize(pub.Headers)
	}
	if pub.DeliveryMode > 0 {
		n++
	}
	if pub.Priority > 0 {
		n++
	}
	short(pub.CorrelationId)
	short(pub.ReplyTo)
	short(pub.Expiration)
	short(pub.MessageId)
	if !pub.Timestamp.IsZero() {
		n += 8
	}
	short(pub.Type)
	short(pub.UserId)
	short(pub.AppId)
	return n
}

// tableSize is the encoded size of a field table: a 4-byte length, then
// each name as a short string followed by its value.
func tableSize(t amqp.Table) int {
	n := 4
	for k, v := range t {
		n += 1 + len(k) + fieldSize(v)
	}
	return n
}

// fieldSize is the encoded size of a table value, type tag included. A type
// amqp091 cannot encode counts 0: amqp091 refuses it before writing.
func fieldSize(v any) int {
	switch x := v.(type) {
	case bool, byte, int8:
		return 2
	case int16:
		return 3
	case int, int32, float32:
		return 5
	case amqp.Decimal:
		return 6
	case int64, float64, time.Time:
		return 9
	case string:
		return 5 + len(x)
	case []byte:
		return 5 + len(x)
	case []any:
		n := 5
		for _, e := range x {
			n += fieldSize(e)
		}
		return n
	case amqp.Table:
		return 1 + tableSize(x)
	case nil:
		return 1
	default:
		return 0
	}
}
