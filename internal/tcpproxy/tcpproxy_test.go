package tcpproxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// quiet is how long a test watches for bytes that must not come.
const quiet = 200 * time.Millisecond

// server accepts one connection on loopback and hands it over.
func server(t *testing.T) (addr string, conns <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			ch <- c
		}
	}()
	return ln.Addr().String(), ch
}

// through starts a proxy to addr and connects a client through it.
func through(t *testing.T, addr string, amqp bool) (*Proxy, net.Conn) {
	t.Helper()
	var p *Proxy
	var err error
	if amqp {
		p, err = StartAMQP(addr)
	} else {
		p, err = Start(addr)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	client, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	return p, client
}

// readN reads n bytes within 5 seconds.
func readN(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	b := make([]byte, n)
	_, err := io.ReadFull(c, b)
	require.NoError(t, err)
	return b
}

// silent asserts that nothing arrives on c for a while.
func silent(t *testing.T, c net.Conn, what string) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(quiet)))
	n, err := c.Read(make([]byte, 1))
	assert.Zero(t, n, what)
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded, what)
}

func TestStallHoldsBytesBothWaysUntilResume(t *testing.T) {
	t.Parallel()
	addr, conns := server(t)
	p, client := through(t, addr, false)
	srv := <-conns
	defer srv.Close()

	_, err := client.Write([]byte("ping"))
	require.NoError(t, err)
	assert.Equal(t, "ping", string(readN(t, srv, 4)))

	p.Stall()
	_, err = client.Write([]byte("up"))
	require.NoError(t, err)
	_, err = srv.Write([]byte("down"))
	require.NoError(t, err)
	silent(t, srv, "a stalled proxy forwards nothing to the server")
	silent(t, client, "a stalled proxy forwards nothing to the client")

	p.Resume()
	assert.Equal(t, "up", string(readN(t, srv, 2)), "the connection stayed open")
	assert.Equal(t, "down", string(readN(t, client, 4)))
}

// amqpFrame encodes a frame the way the proxy reads them.
func amqpFrame(typ byte, channel uint16, payload []byte) []byte {
	f := []byte{typ, byte(channel >> 8), byte(channel)}
	f = binary.BigEndian.AppendUint32(f, uint32(len(payload)))
	return append(append(f, payload...), 0xCE)
}

// readFrame reads one frame and returns its type, channel and payload.
func readFrame(t *testing.T, c net.Conn) (byte, uint16, []byte) {
	t.Helper()
	head := readN(t, c, 7)
	size := binary.BigEndian.Uint32(head[3:7])
	rest := readN(t, c, int(size)+1)
	require.Equal(t, byte(0xCE), rest[size], "frame end")
	return head[0], binary.BigEndian.Uint16(head[1:3]), rest[:size]
}

func TestBlockInjectsFramesBetweenServerFrames(t *testing.T) {
	t.Parallel()
	addr, conns := server(t)
	p, client := through(t, addr, true)
	srv := <-conns
	defer srv.Close()

	_, err := client.Write([]byte("AMQP\x00\x00\x09\x01"))
	require.NoError(t, err)
	assert.Equal(t, "AMQP\x00\x00\x09\x01", string(readN(t, srv, 8)))
	start := amqpFrame(1, 0, []byte{0, 10, 0, 10, 'x'})
	_, err = srv.Write(start)
	require.NoError(t, err)
	typ, ch, payload := readFrame(t, client)
	assert.Equal(t, byte(1), typ)
	assert.Equal(t, uint16(0), ch)
	assert.Equal(t, start[7:len(start)-1], payload)

	// The server is halfway through a frame when the proxy blocks: the
	// injected frame goes before it, not inside it.
	body := amqpFrame(3, 1, bytes.Repeat([]byte("b"), 1000))
	_, err = srv.Write(body[:500])
	require.NoError(t, err)
	p.Block("low on memory")
	_, err = srv.Write(body[500:])
	require.NoError(t, err)

	typ, ch, payload = readFrame(t, client)
	assert.Equal(t, byte(1), typ)
	assert.Equal(t, uint16(0), ch)
	assert.Equal(t, append([]byte{0, 10, 0, 60, 13}, "low on memory"...), payload, "connection.blocked with its reason")
	typ, ch, payload = readFrame(t, client)
	assert.Equal(t, byte(3), typ)
	assert.Equal(t, uint16(1), ch)
	assert.Equal(t, body[7:len(body)-1], payload, "the server's frame arrives whole")

	_, err = client.Write([]byte("publish"))
	require.NoError(t, err)
	silent(t, srv, "a blocked client's bytes are held back")

	p.Unblock()
	typ, ch, payload = readFrame(t, client)
	assert.Equal(t, byte(1), typ)
	assert.Equal(t, uint16(0), ch)
	assert.Equal(t, []byte{0, 10, 0, 61}, payload, "connection.unblocked")
	assert.Equal(t, "publish", string(readN(t, srv, 7)))
}

func TestCloseEndsStalledConnections(t *testing.T) {
	t.Parallel()
	addr, conns := server(t)
	p, client := through(t, addr, false)
	srv := <-conns
	defer srv.Close()
	p.Stall()
	_, err := client.Write([]byte("held"))
	require.NoError(t, err)
	require.NoError(t, p.Close())
	require.NoError(t, client.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = client.Read(make([]byte, 1))
	assert.True(t, errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err), "the client sees the close: %v", err)
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

func TestBlockNeedsAMQP(t *testing.T) {
	t.Parallel()
	p, err := Start("127.0.0.1:1")
	require.NoError(t, err)
	defer p.Close()
	assert.Panics(t, func() { p.Block("x") })
}

// TestSlowDelaysBytesUntilItEnds: under Slow, bytes still arrive, each way,
// but not before the delay; Slow(0) lets them through at once again.
func TestSlowDelaysBytesUntilItEnds(t *testing.T) {
	addr, conns := server(t)
	p, client := through(t, addr, false)
	srv := <-conns
	defer srv.Close()

	p.Slow(2 * quiet)
	_, err := client.Write([]byte("up"))
	require.NoError(t, err)
	silent(t, srv, "a slowed link holds bytes for the delay")
	assert.Equal(t, []byte("up"), readN(t, srv, 2))
	_, err = srv.Write([]byte("down"))
	require.NoError(t, err)
	silent(t, client, "both ways")
	assert.Equal(t, []byte("down"), readN(t, client, 4))

	p.Slow(0)
	_, err = client.Write([]byte("x"))
	require.NoError(t, err)
	require.NoError(t, srv.SetReadDeadline(time.Now().Add(quiet)))
	b := make([]byte, 1)
	_, err = io.ReadFull(srv, b)
	require.NoError(t, err, "no delay once Slow(0)")
}
