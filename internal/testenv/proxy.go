package testenv

import (
	"net/url"
	"testing"

	"github.com/bentoevents/bento/internal/tcpproxy"
)

// Proxied starts a TCP proxy (tcpproxy.Start) to the host of the URL raw,
// a PostgreSQL DSN or an AMQP URL, and returns a copy of raw whose host is
// the proxy, and the proxy, which the test's cleanup closes. Cutting or
// stalling the proxy is a network fault between the client and the
// service.
func Proxied(t testing.TB, raw string) (string, *tcpproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("testenv: the address to proxy must be a URL: %v", err)
	}
	p, err := tcpproxy.Start(u.Host)
	if err != nil {
		t.Fatalf("testenv: start a proxy to %s: %v", u.Host, err)
	}
	t.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr()
	return u.String(), p
}
