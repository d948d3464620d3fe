package rabbitmq

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/messaging"
)

// HeaderDeliveryCount is the header in which a quorum queue counts the
// times it delivered a message before, toward its delivery limit.
const HeaderDeliveryCount = "x-delivery-count"

// uuidHeader is the AMQP header watermill-amqp carries the message UUID in.
const uuidHeader = wamqp.DefaultMessageUUIDHeaderKey

// marshaler maps watermill messages to AMQP and back. On the way out it is
// watermill-amqp's DefaultMarshaler (metadata as headers, UUID in the
// _watermill_message_uuid header, persistent delivery) plus the MessageId and
// ContentType properties. On the way in it never fails, because a message
// that fails to unmarshal is nacked and requeued forever:
//   - a header that is not a string (RabbitMQ's x-death table, numbers from
//     other producers) is converted to a string, tables and arrays as JSON,
//     or dropped when it cannot be;
//   - without the UUID header, the UUID is the AMQP MessageId property, so
//     messages from producers that are not watermill keep their identity.
type marshaler struct{}

var defaultMarshaler = wamqp.DefaultMarshaler{
	PostprocessPublishing: func(p amqp.Publishing) amqp.Publishing {
		p.MessageId, _ = p.Headers[uuidHeader].(string)
		p.ContentType = "application/json"
		return p
	},
}

// Marshal implements wamqp.Marshaler. Partition queues' hash exchange drops
// a message without a partition key, so every message bento publishes gets
// one: messaging.PartitionKey of msg when its metadata has none.
func (marshaler) Marshal(msg *message.Message) (amqp.Publishing, error) {
	p, err := defaultMarshaler.Marshal(msg)
	if err != nil {
		return p, err
	}
	if k, _ := headerString(p.Headers[messaging.MetaPartitionKey]); k == "" {
		p.Headers[messaging.MetaPartitionKey] = messaging.PartitionKey(msg)
	}
	return p, nil
}

// Unmarshal implements wamqp.Marshaler.
func (marshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	id, _ := d.Headers[uuidHeader].(string)
	if id == "" {
		id = d.MessageId
	}
	msg := message.NewMessage(id, d.Body)
	for k, v := range d.Headers {
		if k == uuidHeader {
			continue
		}
		if s, ok := headerString(v); ok {
			msg.Metadata[k] = s
		}
	}
	if d.Redelivered {
		msg.Metadata[messaging.MetaRedelivered] = "true"
	} else {
		delete(msg.Metadata, messaging.MetaRedelivered) // a header from a producer means nothing
	}
	return msg, nil
}

// headerString renders an AMQP header value as a string, reporting false
// for a value it cannot render (nil, or a table that does not encode).
func headerString(v any) (string, bool) {
	switch x := v.(type) {
	case nil:
		return "", false
	case string:
		return x, true
	case []byte:
		return string(x), true
	case bool:
		return strconv.FormatBool(x), true
	case int8, int16, int32, int64, int, uint8, uint16, uint32, uint64, uint:
		return fmt.Sprint(x), true
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32), true
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), true
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano), true
	default: // amqp.Table, []any, amqp.Decimal
		b, err := json.Marshal(x)
		if err != nil {
			return "", false
		}
		return string(b), true
	}
}
