package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/internal/dberr"
	"github.com/bentoevents/bento/messaging"
)

// partitionRun is one Run of a partitioned consumer: the partitions it
// handles now, each in its own goroutine, one message at a time.
type partitionRun struct {
	c       *Consumer
	sub     message.Subscriber
	handle  message.HandlerFunc
	slots   chan struct{} // PartitionConcurrency, when limited
	base    context.Context
	workers map[int]*partitionWorker
	wg      sync.WaitGroup
}

// partitionWorker handles one partition until stop is closed (it finishes
// the message in hand first) or its context is cancelled (it abandons it,
// to be redelivered).
type partitionWorker struct {
	stop   chan struct{}
	done   chan struct{}
	cancel context.CancelFunc
}

// runPartitioned is Run for Partitions > 0: it joins the group's membership,
// handles the partitions dealt to this instance, and follows the membership
// as instances come and go, until ctx ends.
func (c *Consumer) runPartitioned(ctx context.Context, handle message.HandlerFunc, patterns []string) error {
	ttl, every, timeout := memberTTL(c.cfg.TakeoverTime), c.cfg.TakeoverTime/4, beatTimeout(c.cfg.TakeoverTime)
	owned, err := c.join(ctx, ttl, every, timeout)
	switch {
	case ctx.Err() != nil:
		return nil // stopped before it started
	case err != nil:
		return err
	}
	sub, err := c.newSub(patterns)
	if err != nil {
		_ = c.members.leave(context.WithoutCancel(ctx))
		return fmt.Errorf("consumer: subscribe %s: %w", c.cfg.Group, err)
	}
	r := &partitionRun{c: c, sub: sub, handle: handle, base: context.WithoutCancel(ctx), workers: map[int]*partitionWorker{}}
	if c.cfg.PartitionConcurrency > 0 {
		r.slots = make(chan struct{}, c.cfg.PartitionConcurrency)
	}
	defer func() {
		r.c.owned.Store(nil)
		r.c.metrics.partitions.Set(0)
		// Keep the membership live while the workers finish what they
		// hold (up to CloseTimeout): until this instance leaves, its
		// partitions stay its own, so no peer is handed a message this
		// instance is still applying (whose attempt the crash ledger
		// would count as a crash) and the workers' commits are not
		// fenced for a membership that merely went unrenewed.
		stopBeats := c.keepMembership(r.base, ttl, every, timeout)
		r.stopAll()
		stopBeats()
		leaveCtx, cancel := context.WithTimeout(r.base, 5*time.Second)
		defer cancel()
		if err := c.members.leave(leaveCtx); err != nil {
			c.cfg.Logger.Warn("consumer: could not leave the group; peers take over its partitions once it expires",
				"group", c.cfg.Group, "err", err)
		}
		_ = sub.Close()
	}()
	r.assign(owned)
	if !c.cfg.DisableHoldBack {
		stopSweep := c.startSweeper(ctx)
		defer stopSweep()
	}
	c.markRunning()
	c.cfg.Logger.Info("consumer: partitions assigned", "group", c.cfg.Group, "member", c.members.id, "partitions", owned)

	lastBeat := time.Now()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		owned, err := c.members.beat(ctx, ttl.Milliseconds(), timeout)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrPartitionMismatch):
			c.cfg.Logger.Error("consumer: keeping the current partitions", "group", c.cfg.Group, "err", err)
			continue
		case err != nil:
			// The database is unreachable: peers cannot take over either,
			// but once this member's row has expired they may, when they
			// reach the database first; stop pulling before that.
			if time.Since(lastBeat) < ttl {
				continue
			}
			if len(r.workers) > 0 {
				c.cfg.Logger.Warn("consumer: membership lapsed; releasing partitions until the database answers",
					"group", c.cfg.Group, "err", err)
			}
			c.lapsed.Store(true)
			owned = nil
			// Their commits would be fenced: give their messages back
			// now, so that a peer can have them.
			r.abandonAll()
		default:
			lastBeat = time.Now()
			c.lapsed.Store(false)
		}
		if !slices.Equal(owned, r.running()) {
			c.cfg.Logger.Info("consumer: partitions reassigned", "group", c.cfg.Group, "member", c.members.id,
				"partitions", owned)
		}
		r.assign(owned)
	}
}

// running returns the partitions with a live worker, in order; it reaps the
// workers that ended on their own (a lost subscription), so assign
// restarts them.
func (r *partitionRun) running() []int {
	var ps []int
	for p, w := range r.workers {
		select {
		case <-w.done:
			delete(r.workers, p)
		default:
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}

// assign stops the workers of partitions not in owned and starts the
// missing ones.
func (r *partitionRun) assign(owned []int) {
	r.c.owned.Store(&owned)
	r.c.metrics.partitions.Set(float64(len(owned)))
	for _, p := range r.running() {
		if !slices.Contains(owned, p) {
			r.release(p)
		}
	}
	for _, p := range owned {
		if r.workers[p] == nil {
			r.start(p)
		}
	}
}

// release tells partition p's worker to stop after the message in hand, or
// to abandon it after CloseTimeout.
func (r *partitionRun) release(p int) {
	w := r.workers[p]
	delete(r.workers, p)
	close(w.stop)
	go func() {
		select {
		case <-w.done:
		case <-time.After(r.c.cfg.CloseTimeout):
			w.cancel()
		}
	}()
}

// abandonAll makes every worker abandon the message in hand, to be
// redelivered.
func (r *partitionRun) abandonAll() {
	for _, w := range r.workers {
		w.cancel()
	}
}

// stopAll releases every partition and waits for the workers.
func (r *partitionRun) stopAll() {
	for p := range r.workers {
		r.release(p)
	}
	r.wg.Wait()
}

// start subscribes to partition p, before it returns (so that Running
// means subscribed), and handles its messages in order in a goroutine,
// committing them under the current membership only. A failed
// subscription is logged and tried again at the next heartbeat.
func (r *partitionRun) start(p int) {
	ctx, cancel := context.WithCancel(withMembership(r.base, r.c.members.gen.Load()))
	queue := messaging.PartitionQueue(r.c.cfg.Group, p)
	r.c.readTap(ctx) // what the broker dead-lettered at the last give-back holds its aggregate first
	msgs, err := r.sub.Subscribe(ctx, queue)
	if err != nil {
		cancel()
		r.c.cfg.Logger.Error("consumer: subscribe to partition; retrying at the next heartbeat",
			"group", r.c.cfg.Group, "queue", queue, "err", err)
		return
	}
	msgs = r.c.watchLimit(ctx, msgs)
	w := &partitionWorker{stop: make(chan struct{}), done: make(chan struct{}), cancel: cancel}
	r.workers[p] = w
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(w.done)
		defer cancel()
		for {
			select {
			case <-w.stop:
				return
			case msg, ok := <-msgs:
				if !ok {
					return
				}
				batch := r.collect(msg, msgs)
				if !r.handleBatch(ctx, p, batch, w.stop) {
					// A message was given back, with those after it: end
					// here, and the next heartbeat subscribes again, so
					// nothing overtakes it.
					return
				}
			}
		}
	}()
}

// collect returns a batch that starts with first: up to BatchSize
// messages, those already at hand or arriving within BatchWait.
func (r *partitionRun) collect(first *message.Message, msgs <-chan *message.Message) []*message.Message {
	batch := []*message.Message{first}
	var wait <-chan time.Time
	if r.c.cfg.BatchWait > 0 && r.c.cfg.BatchSize > 1 {
		t := time.NewTimer(r.c.cfg.BatchWait)
		defer t.Stop()
		wait = t.C
	}
	for len(batch) < r.c.cfg.BatchSize {
		select {
		case m, ok := <-msgs:
			if !ok {
				return batch
			}
			batch = append(batch, m)
			continue
		default:
		}
		if wait == nil {
			return batch
		}
		select {
		case m, ok := <-msgs:
			if !ok {
				return batch
			}
			batch = append(batch, m)
		case <-wait:
			return batch
		}
	}
	return batch
}

// handleBatch handles consecutive messages of partition p, within the
// concurrency limit: as many as it can in one transaction, and the one
// that stops a transaction, if any, on its own, with the retry rules, before
// those after it. It reports false when it gave a message back (the
// partition is stopping, or a dead letter could not be published).
func (r *partitionRun) handleBatch(ctx context.Context, p int, batch []*message.Message, stop <-chan struct{}) bool {
	for i, msg := range batch {
		msg.SetContext(withPartition(msg.Context(), p))
		if msg.Context().Err() != nil {
			// Given back already (the subscription ended): so is the rest.
			giveBack(batch[i:])
			return false
		}
	}
	if r.slots != nil {
		select {
		case r.slots <- struct{}{}:
			defer func() { <-r.slots }()
		case <-stop:
			giveBack(batch)
			return false
		case <-ctx.Done():
			giveBack(batch)
			return false
		}
	}
	for len(batch) > 0 {
		n := 0
		if len(batch) > 1 {
			n = r.c.applyBatch(ctx, batch)
		}
		for _, msg := range batch[:n] {
			msg.Ack()
		}
		batch = batch[n:]
		if len(batch) == 0 {
			return true
		}
		start := time.Now()
		if _, err := r.handle(batch[0]); err != nil {
			giveBack(batch)
			return false
		}
		r.c.metrics.observe(1, start)
		batch[0].Ack()
		batch = batch[1:]
	}
	return true
}

// giveBack nacks msgs, giving them back to their queue in order.
func giveBack(msgs []*message.Message) {
	for _, m := range msgs {
		m.Nack()
	}
}

// startSweeper sweeps the parked events of the partitions this instance
// owns every sweepEvery until the returned function is called (which waits
// for the sweep in progress).
func (c *Consumer) startSweeper(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(sweepEvery)
		defer tick.Stop()
		var (
			quiet bool      // the last sweep found the partitions without parked events
			swept []int     // the partitions it swept
			last  time.Time // when it ran
		)
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if c.breaker.isOpen() {
				continue
			}
			c.readTap(ctx)
			owned := c.Partitions()
			if quiet && !c.parkedSince.Load() && slices.Equal(owned, swept) && time.Since(last) < quietSweepEvery {
				continue
			}
			c.parkedSince.Store(false)
			quiet = !c.sweep(ctx, owned) && c.noneParked(ctx)
			swept, last = owned, time.Now()
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// join makes the instance's first beat, trying again every pause while the
// database is slow or unreachable (a beat that timed out, a busy SQLite, a
// lost connection), so that an instance started during a database hiccup
// waits for it instead of stopping. Other errors, such as
// ErrPartitionMismatch, are returned at once.
func (c *Consumer) join(ctx context.Context, ttl, pause, timeout time.Duration) ([]int, error) {
	for {
		owned, err := c.members.beat(ctx, ttl.Milliseconds(), timeout)
		if err == nil || ctx.Err() != nil {
			return owned, err
		}
		if !dberr.IsTransient(err) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		c.cfg.Logger.Warn("consumer: joining the group's membership failed; trying again", "group", c.cfg.Group, "err", err)
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(pause):
		}
	}
}

// keepMembership renews the instance's membership every pause until the
// returned stop is called, ignoring what the beats say about partitions:
// it runs while a stopping instance's workers finish, before it leaves.
func (c *Consumer) keepMembership(ctx context.Context, ttl, pause, timeout time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(pause)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			if _, err := c.members.beat(ctx, ttl.Milliseconds(), timeout); err != nil {
				c.cfg.Logger.Warn("consumer: could not renew the membership while stopping", "group", c.cfg.Group, "err", err)
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}
