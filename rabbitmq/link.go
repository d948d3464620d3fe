package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// closeTimeout bounds how long a ConfirmPublisher waits for the broker to
// answer a channel.close or connection.close before it closes the socket.
const closeTimeout = 2 * time.Second

// link is one AMQP connection of a ConfirmPublisher and its TCP socket.
// amqp091 neither lets a context interrupt a write to the socket nor bounds
// its wait for a close-ok, so on a link that stops answering without
// closing, the only way out is to close the socket ourselves: that fails
// the stuck write and every wait on the connection at once.
//
// A link also follows the broker's connection.blocked and
// connection.unblocked: while blocked, the broker reads nothing from it.
type link struct {
	conn      *amqp.Connection
	sock      net.Conn
	frameSize int // the largest frame, negotiated with the broker; 0 for no limit
	log       *slog.Logger
	metrics   *publisherMetrics

	mu        sync.Mutex
	unblocked chan struct{} // non-nil while blocked; closed at the unblock
	reason    string        // the broker's reason for the block
}

func dialLink(ctx context.Context, cfg *Config, m *publisherMetrics) (*link, error) {
	conn, sock, err := cfg.dialSocket(ctx)
	if err != nil {
		return nil, err
	}
	l := &link{conn: conn, sock: sock, frameSize: conn.Config.FrameSize, log: cfg.Logger, metrics: m}
	go l.watchBlocked(conn.NotifyBlocked(make(chan amqp.Blocking, 1)))
	return l, nil
}

// watchBlocked follows the broker's connection.blocked and unblocked until
// the connection closes, which also ends a block.
func (l *link) watchBlocked(notes <-chan amqp.Blocking) {
	for b := range notes {
		l.setBlocked(b.Active, b.Reason, "AMQP connection unblocked by the broker; publishing resumes")
	}
	l.setBlocked(false, "", "AMQP connection closed while blocked")
}

func (l *link) setBlocked(active bool, reason, unblockMsg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case active && l.unblocked == nil:
		l.unblocked = make(chan struct{})
		l.reason = reason
		l.metrics.block(1)
		l.log.Warn("AMQP connection blocked by the broker; publishing waits", "reason", reason)
	case !active && l.unblocked != nil:
		close(l.unblocked)
		l.unblocked = nil
		l.metrics.block(-1)
		l.log.Info(unblockMsg, "reason", l.reason)
	}
}

// blocked returns a channel closed once the connection is unblocked and
// the broker's reason, or nil when the connection is not blocked.
func (l *link) blocked() (<-chan struct{}, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unblocked == nil {
		return nil, ""
	}
	return l.unblocked, l.reason
}

// kill closes the socket: the connection shuts down at once.
func (l *link) kill() { _ = l.sock.Close() }

// guard runs fn, which does I/O on the connection that amqp091 does not
// bound, and kills the link if ctx ends meanwhile. An error returned after
// ctx ended wraps ctx's error.
func (l *link) guard(ctx context.Context, fn func() error) error {
	var running atomic.Bool
	running.Store(true)
	stop := context.AfterFunc(ctx, func() {
		if running.Load() {
			l.kill()
		}
	})
	err := fn()
	running.Store(false)
	stop()
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return err
}

// closeChannel closes ch in the background; if the broker has not answered
// within closeTimeout, it kills the link.
func (l *link) closeChannel(ch *amqp.Channel) {
	if ch.IsClosed() {
		return
	}
	go func() {
		done := make(chan struct{})
		go func() {
			_ = ch.Close()
			close(done)
		}()
		t := time.NewTimer(closeTimeout)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			l.log.Warn("AMQP broker did not answer channel.close; closing the connection", "timeout", closeTimeout)
			l.kill()
		}
	}()
}

// close closes the connection, waiting at most closeTimeout for the
// broker's close-ok before closing the socket.
func (l *link) close() error {
	if wait, _ := l.blocked(); wait != nil || l.conn.IsClosed() {
		// A blocked broker does not read the close: just drop the socket.
		l.kill()
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- l.conn.Close() }()
	t := time.NewTimer(closeTimeout)
	defer t.Stop()
	select {
	case err := <-done:
		l.kill()
		if err != nil && !errors.Is(err, amqp.ErrClosed) {
			return fmt.Errorf("rabbitmq: close AMQP connection: %w", err)
		}
		return nil
	case <-t.C:
		l.log.Warn("AMQP broker did not answer connection.close; closed the socket", "timeout", closeTimeout)
		l.kill()
		return nil
	}
}
