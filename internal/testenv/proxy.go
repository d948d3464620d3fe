package testenv

import (
	"net/url"
	"testing"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

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

// ProxiedPostgres is Proxied for a PostgreSQL DSN (such as the one
// Postgres returns): it returns a GORM handle whose connections go through
// the proxy, closed at cleanup, and the proxy.
func ProxiedPostgres(t testing.TB, dsn string) (*gorm.DB, *tcpproxy.Proxy) {
	t.Helper()
	via, proxy := Proxied(t, dsn)
	db, err := gorm.Open(postgres.Open(via), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		t.Fatalf("testenv: open PostgreSQL through the proxy: %v", err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	return db, proxy
}
