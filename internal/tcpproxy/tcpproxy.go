// Package tcpproxy is a loopback TCP proxy for tests that cut a client off
// from a server (a broker, a database) and restore it, stall the link
// without closing it (a server or network that stops answering), and, for
// AMQP, play the broker's connection.blocked and connection.unblocked.
package tcpproxy

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections accepted on 127.0.0.1 to a target address.
type Proxy struct {
	ln     net.Listener
	target string
	amqp   bool

	mu      sync.Mutex
	cut     bool
	stalled bool
	blocked bool
	delay   time.Duration // added before each chunk moves, either way (Slow)
	changed chan struct{} // closed and replaced when stalled or blocked change
	pairs   map[*pair]struct{}
	wg      sync.WaitGroup
}

// pair is one proxied connection: the client's end and the server's.
type pair struct {
	client, server net.Conn
	done           chan struct{} // closed once both ends are closed
	once           sync.Once
	wmu            sync.Mutex // serialises writes to the client (frames, injections)
}

func (c *pair) close() {
	c.once.Do(func() {
		close(c.done)
		_ = c.client.Close()
		_ = c.server.Close()
	})
}

// Start listens on a free loopback port and forwards bytes to target as
// they come.
func Start(target string) (*Proxy, error) {
	return start(target, false)
}

// StartAMQP is Start for an AMQP 0-9-1 server: the proxy also reads the
// server's frames, so that Block and Unblock can slip frames of their own in
// between them.
func StartAMQP(target string) (*Proxy, error) {
	return start(target, true)
}

func start(target string, amqp bool) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, amqp: amqp, changed: make(chan struct{}), pairs: map[*pair]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every open connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.pairs {
		c.close()
	}
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// Stall stops moving bytes in both directions, on open connections and on
// those accepted later, without closing anything: to the client the server
// has gone silent, as behind a dead network path. Writes then pile up in
// the socket buffers until they block. Resume undoes it.
func (p *Proxy) Stall() { p.set(func() { p.stalled = true }) }

// Resume moves bytes again after Stall.
func (p *Proxy) Resume() { p.set(func() { p.stalled = false }) }

// Slow delays every chunk of bytes by d before it moves, in both
// directions, on open connections and on those accepted later: a slow or
// congested network path. Slow(0) ends it.
func (p *Proxy) Slow(d time.Duration) { p.set(func() { p.delay = max(d, 0) }) }

// Block plays a RabbitMQ broker under a resource alarm: it sends a
// connection.blocked frame (channel 0, class 10, method 60) with reason to
// every open client connection, between two of the server's frames, and
// stops forwarding what the clients send, as the broker stops reading from
// blocked publishers. Connections accepted later are not blocked. It panics
// unless the proxy was started with StartAMQP.
func (p *Proxy) Block(reason string) {
	p.mustAMQP()
	p.set(func() { p.blocked = true })
	reason = reason[:min(len(reason), 255)]
	// class 10, method 60, reason as a shortstr
	payload := append([]byte{0, 10, 0, 60, byte(len(reason))}, reason...)
	p.inject(frame(1, 0, payload))
}

// Unblock ends Block: it sends connection.unblocked (class 10, method 61) to
// every open client connection and forwards their bytes again. It panics
// unless the proxy was started with StartAMQP.
func (p *Proxy) Unblock() {
	p.mustAMQP()
	p.inject(frame(1, 0, []byte{0, 10, 0, 61}))
	p.set(func() { p.blocked = false })
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) mustAMQP() {
	if !p.amqp {
		panic("tcpproxy: Block and Unblock need a proxy started with StartAMQP")
	}
}

// set changes the forwarding state under the lock and wakes the pipes.
func (p *Proxy) set(change func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	change()
	close(p.changed)
	p.changed = make(chan struct{})
}

// inject writes f to every open client connection, between two frames.
func (p *Proxy) inject(f []byte) {
	p.mu.Lock()
	pairs := make([]*pair, 0, len(p.pairs))
	for c := range p.pairs {
		pairs = append(pairs, c)
	}
	p.mu.Unlock()
	for _, c := range pairs {
		c.wmu.Lock()
		_, _ = c.client.Write(f)
		c.wmu.Unlock()
	}
}

// frame encodes an AMQP frame: type, channel, payload size, payload, 0xCE.
func frame(typ byte, channel uint16, payload []byte) []byte {
	f := make([]byte, 7, 7+len(payload)+1)
	f[0] = typ
	binary.BigEndian.PutUint16(f[1:3], channel)
	binary.BigEndian.PutUint32(f[3:7], uint32(len(payload)))
	f = append(f, payload...)
	return append(f, 0xCE)
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refused := p.cut
		p.mu.Unlock()
		if refused {
			_ = client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		c := &pair{client: client, server: server, done: make(chan struct{})}
		if !p.track(c) {
			continue
		}
		p.wg.Add(2)
		go p.upstream(c)
		go p.downstream(c)
	}
}

// track registers c, or closes it if the proxy was cut meanwhile.
func (p *Proxy) track(c *pair) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		c.close()
		return false
	}
	p.pairs[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c *pair) {
	c.close()
	p.mu.Lock()
	delete(p.pairs, c)
	p.mu.Unlock()
}

// wait returns once bytes may flow in the given direction, or false once c
// is closed.
func (p *Proxy) wait(c *pair, upstream bool) bool {
	slept := false
	for {
		p.mu.Lock()
		hold := p.stalled || (upstream && p.blocked)
		changed, delay := p.changed, p.delay
		p.mu.Unlock()
		if !hold && delay > 0 && !slept {
			slept = true
			select {
			case <-time.After(delay):
			case <-c.done:
				return false
			}
			continue // a stall may have begun meanwhile
		}
		if !hold {
			return true
		}
		select {
		case <-changed:
		case <-c.done:
			return false
		}
	}
}

// upstream copies client to server.
func (p *Proxy) upstream(c *pair) {
	defer p.wg.Done()
	defer p.untrack(c)
	buf := make([]byte, 32<<10)
	for {
		n, err := c.client.Read(buf)
		if n > 0 {
			if !p.wait(c, true) {
				return
			}
			if _, werr := c.server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// downstream copies server to client, a whole frame at a time for AMQP.
func (p *Proxy) downstream(c *pair) {
	defer p.wg.Done()
	defer p.untrack(c)
	forward := func(b []byte) bool {
		if !p.wait(c, false) {
			return false
		}
		c.wmu.Lock()
		defer c.wmu.Unlock()
		_, err := c.client.Write(b)
		return err == nil
	}
	if !p.amqp {
		buf := make([]byte, 32<<10)
		for {
			n, err := c.server.Read(buf)
			if n > 0 && !forward(buf[:n]) {
				return
			}
			if err != nil {
				return
			}
		}
	}
	// The server's side of AMQP 0-9-1 is frames from the first byte:
	// type (1 method, 2 header, 3 body, 8 heartbeat), channel uint16,
	// size uint32, payload, 0xCE. Anything else (a protocol header sent
	// back to refuse the client's version) is passed on as it is.
	var buf []byte
	for {
		head := make([]byte, 7)
		if _, err := io.ReadFull(c.server, head); err != nil {
			return
		}
		if t := head[0]; t != 1 && t != 2 && t != 3 && t != 8 {
			if !forward(head) {
				return
			}
			_, _ = io.Copy(c.client, c.server)
			return
		}
		size := int(binary.BigEndian.Uint32(head[3:7]))
		if cap(buf) < 7+size+1 {
			buf = make([]byte, 7+size+1)
		}
		f := buf[:7+size+1]
		copy(f, head)
		if _, err := io.ReadFull(c.server, f[7:]); err != nil {
			return
		}
		if !forward(f) {
			return
		}
	}
}
