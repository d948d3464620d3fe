package messaging

import (
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ErrMessageTooLarge is returned by a bus for a message it can never carry
// as it is: on RabbitMQ, one whose properties and headers (its metadata) do
// not fit one AMQP frame of the connection (RabbitMQ's frame_max, 128 KiB by
// default; its body may be of any size). The message is not sent.
// Publishing it again cannot succeed, so the projector sends its event to
// the dead state at once.
var ErrMessageTooLarge = errors.New("messaging: message too large for the bus")

// Outgoing is one message of a batch and the topic (routing key) it is
// published under, as a batch publisher (rabbitmq.ConfirmPublisher) takes
// it.
type Outgoing struct {
	Topic   string
	Message *message.Message
}
