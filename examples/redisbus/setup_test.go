package redisbus_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/bentoevents/bento/examples/redisbus"
)

// defaultRedisAddr is the test Redis unless BENTO_TEST_REDIS_ADDR is set.
const defaultRedisAddr = "127.0.0.1:6379"

const startRedis = `start it with: mkdir -p /var/lib/redis /var/log/redis && ` +
	`redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no ` +
	`--dir /var/lib/redis --logfile /var/log/redis/ci.log (or run scripts/services.sh, or set BENTO_TEST_REDIS_ADDR)`

// TB is what the helpers need of a test: *testing.T and bustest.TB both
// have it.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// requireRedis returns the address of the test Redis after checking that
// it is on this machine and answers PING. When it does not answer, the test
// is skipped with how to start it, or fails when the CI environment
// variable is set (the contract of bento's internal/testenv).
func requireRedis(t testing.TB) string {
	t.Helper()
	addr := os.Getenv("BENTO_TEST_REDIS_ADDR")
	if addr == "" {
		addr = defaultRedisAddr
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("BENTO_TEST_REDIS_ADDR %q: %v", addr, err)
	}
	if ip := net.ParseIP(strings.Trim(host, "[]")); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		t.Fatalf("Redis test target %q is not a loopback address; tests only ever talk to this machine", addr)
	}
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 3 * time.Second, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		msg := fmt.Sprintf("Redis unavailable at %s: %v; %s", addr, err, startRedis)
		if os.Getenv("CI") != "" {
			t.Fatalf("%s (CI is set, so this is a failure)", msg)
		}
		t.Skip(msg)
	}
	return addr
}

// newConfig returns a Config on addr whose streams all start with a fresh
// prefix; every key under it is deleted at cleanup.
func newConfig(t TB, addr string) redisbus.Config {
	t.Helper()
	prefix := "bt-" + randomHex(6) + ":"
	t.Cleanup(func() { deleteKeys(t, addr, prefix) })
	return redisbus.Config{Addr: addr, StreamPrefix: prefix, Logger: testLogger()}
}

// deleteKeys deletes the keys that start with prefix.
func deleteKeys(t TB, addr, prefix string) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var keys []string
	iter := c.Scan(ctx, 0, prefix+"*", 100).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Logf("scan %s*: %v", prefix, err)
		return
	}
	if len(keys) > 0 {
		if err := c.Del(ctx, keys...).Err(); err != nil {
			t.Logf("delete %d keys under %s: %v", len(keys), prefix, err)
		}
	}
}

// testLogger keeps the tests quiet but for errors, written to stderr (a
// logger bound to a test would panic when a goroutine logs after the test
// ended).
func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
