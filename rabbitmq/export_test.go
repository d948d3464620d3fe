package rabbitmq

import "github.com/ThreeDotsLabs/watermill/message"

// SkipSizeCheck makes p write messages whose content header does not fit a
// frame, so that tests can watch what the broker does with them.
func SkipSizeCheck(p *ConfirmPublisher) { p.skipSizeCheck = true }

// FrameSize returns the frame size p's connection negotiated, 0 before it
// connected.
func FrameSize(p *ConfirmPublisher) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.link == nil {
		return 0
	}
	return p.link.frameSize
}

// HeaderFrameSize returns the size of the content header frame m is sent
// with.
func HeaderFrameSize(m *message.Message) int {
	pub, err := marshaler{}.Marshal(m)
	if err != nil {
		panic(err)
	}
	return headerFrameSize(&pub)
}

// SetHashExchangeType makes DeclarePartitions ask for exchange type typ, and
// returns a function that restores the real one.
func SetHashExchangeType(typ string) (restore func()) {
	old := hashExchangeType
	hashExchangeType = typ
	return func() { hashExchangeType = old }
}

// Resolve returns cfg validated, with its defaults filled in.
func Resolve(cfg *Config) (*Config, error) { return cfg.resolve() }

// QueueArgs returns the arguments of spec's partition queues.
func QueueArgs(spec PartitionSpec) map[string]any { return spec.queueArgs() }
