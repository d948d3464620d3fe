// Package testenv gives bento's tests their databases and brokers.
//
// PostgreSQL tests each get a fresh schema (dropped at cleanup) in the
// database named by BENTO_TEST_POSTGRES_DSN, so they run in parallel and
// leave nothing behind; SQLite tests get a file in a temporary directory.
// A service that cannot be reached makes the test skip with a message that
// says how to start it, except when the CI environment variable is set: then
// the test fails. Only loopback addresses are accepted as targets.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/internal/embeddb"
)

// Defaults for the service addresses.
const (
	DefaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
)

const (
	startPostgres = "start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start (or set BENTO_TEST_POSTGRES_DSN)"
	startRabbitMQ = "start it with: rabbitmq-server -detached (or set BENTO_TEST_AMQP_URL)"
)

// InCI reports whether the tests run in CI, where a missing service is a
// failure rather than a skip.
func InCI() bool { return os.Getenv("CI") != "" }

// PostgresDSN returns BENTO_TEST_POSTGRES_DSN or the default.
func PostgresDSN() string {
	if v := os.Getenv("BENTO_TEST_POSTGRES_DSN"); v != "" {
		return v
	}
	return DefaultPostgresDSN
}

// AMQPURL returns BENTO_TEST_AMQP_URL or the default.
func AMQPURL() string {
	if v := os.Getenv("BENTO_TEST_AMQP_URL"); v != "" {
		return v
	}
	return DefaultAMQPURL
}

// unavailable skips the test, or fails it in CI.
func unavailable(t testing.TB, service string, err error, how string) {
	t.Helper()
	msg := fmt.Sprintf("%s unavailable: %v; %s", service, err, how)
	if InCI() {
		t.Fatalf("%s (CI is set, so this is a failure)", msg)
	}
	t.Skip(msg)
}

// requireLoopback fails the test unless host is a loopback address, a
// localhost name or a Unix socket directory.
func requireLoopback(t testing.TB, service, host string) {
	t.Helper()
	if host == "" || strings.HasPrefix(host, "/") || host == "localhost" {
		return
	}
	if ip := net.ParseIP(strings.Trim(host, "[]")); ip != nil && ip.IsLoopback() {
		return
	}
	t.Fatalf("%s test target %q is not a loopback address; tests only ever talk to this machine", service, host)
}

var admin struct {
	once sync.Once
	db   *sql.DB
	err  error
}

func adminDB() (*sql.DB, error) {
	admin.once.Do(func() {
		db, err := sql.Open("pgx", PostgresDSN())
		if err != nil {
			admin.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := db.PingContext(ctx); err != nil {
			_ = db.Close()
			admin.err = err
			return
		}
		db.SetMaxOpenConns(4)
		admin.db = db
	})
	return admin.db, admin.err
}

// PostgresConfig parses the test DSN (checking that it targets this machine)
// and returns it with search_path set to schema.
func PostgresConfig(t testing.TB, schema string) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(PostgresDSN())
	if err != nil {
		t.Fatalf("BENTO_TEST_POSTGRES_DSN: %v", err)
	}
	requireLoopback(t, "PostgreSQL", cfg.Host)
	if schema != "" {
		cfg.RuntimeParams["search_path"] = schema
	}
	return cfg
}

// RequirePostgres checks that the test database is on this machine and
// answers, and returns its DSN, for tests that create their own schemas
// (or whose subprocesses do).
func RequirePostgres(t testing.TB) string {
	t.Helper()
	PostgresConfig(t, "")
	if _, err := adminDB(); err != nil {
		unavailable(t, "PostgreSQL", err, startPostgres)
	}
	return PostgresDSN()
}

// Postgres returns a GORM handle on a new, empty schema of the test
// database, dropped when the test ends. The returned DSN reaches the same
// schema (for LISTEN connections and subprocesses).
func Postgres(t testing.TB) (*gorm.DB, string) {
	t.Helper()
	PostgresConfig(t, "") // checks the DSN and that it is on this machine
	adm, err := adminDB()
	if err != nil {
		unavailable(t, "PostgreSQL", err, startPostgres)
	}
	schema := "bt_" + randomHex(6)
	ctx := context.Background()
	if _, err := adm.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	dsn := withSearchPath(PostgresDSN(), schema)
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		t.Fatalf("open postgres: %v", err)
	}
	sqlDB, _ := db.DB()
	sqlDB.SetMaxOpenConns(10)
	t.Cleanup(func() {
		_ = sqlDB.Close()
		if _, err := adm.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return db, dsn
}

// withSearchPath adds search_path=schema to a URL or keyword/value DSN.
func withSearchPath(dsn, schema string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " search_path=" + schema
}

// SQLite returns a GORM handle on a new SQLite file in a temporary directory.
func SQLite(t testing.TB) *gorm.DB {
	t.Helper()
	db, err := embeddb.Open(filepath.Join(t.TempDir(), "bento.db"), nil)
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	sqlDB, _ := db.DB()
	t.Cleanup(func() { _ = sqlDB.Close() })
	return db
}

// Backend is a database a behavioural suite runs on.
type Backend struct {
	// Name is "postgres", "postgres-partitioned" or "sqlite".
	Name string
	// Open returns a fresh, empty database for one test.
	Open func(t testing.TB) *gorm.DB
	// Notify reports whether the backend has LISTEN/NOTIFY.
	Notify bool
	// SkipLocked reports whether the backend has FOR UPDATE SKIP LOCKED.
	SkipLocked bool
	// Partitioned reports whether bento's tables are created partitioned
	// (see PartitionTables).
	Partitioned bool
}

// Backends returns the plain database backends, PostgreSQL first.
func Backends() []Backend {
	return []Backend{
		{Name: "postgres", Open: func(t testing.TB) *gorm.DB { db, _ := Postgres(t); return db }, Notify: true, SkipLocked: true},
		{Name: "sqlite", Open: SQLite},
	}
}

// partitionSetup is set by PartitionTables.
var partitionSetup func(t testing.TB, db *gorm.DB)

// PartitionTables makes ForEachBackend run every suite of the calling test
// binary on a third backend, "postgres-partitioned": a fresh PostgreSQL
// schema on which setup has created bento's tables partitioned before the
// test starts. The suites' own Migrate calls then find the tables and keep
// their layout, so the same tests run unchanged against partitioned tables.
// Call it from an init function in a _test.go file; packages that do not
// call it run on the plain backends only.
func PartitionTables(setup func(t testing.TB, db *gorm.DB)) {
	partitionSetup = setup
}

// suiteBackends returns the backends ForEachBackend runs on.
func suiteBackends() []Backend {
	bs := Backends()
	if setup := partitionSetup; setup != nil {
		bs = append(bs, Backend{
			Name: "postgres-partitioned",
			Open: func(t testing.TB) *gorm.DB {
				db, _ := Postgres(t)
				setup(t, db)
				return db
			},
			Notify: true, SkipLocked: true, Partitioned: true,
		})
	}
	return bs
}

// ForEachBackend runs fn as a parallel subtest on each backend with a fresh
// database: Backends, and "postgres-partitioned" in test binaries that call
// PartitionTables.
func ForEachBackend(t *testing.T, fn func(t *testing.T, b Backend, db *gorm.DB)) {
	t.Helper()
	for _, b := range suiteBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, b, b.Open(t))
		})
	}
}

// RequireAMQP returns the AMQP URL after checking that the broker accepts TCP
// connections and is on this machine.
func RequireAMQP(t testing.TB) string {
	t.Helper()
	u, err := url.Parse(AMQPURL())
	if err != nil {
		t.Fatalf("BENTO_TEST_AMQP_URL: %v", err)
	}
	requireLoopback(t, "RabbitMQ", u.Hostname())
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "5672")
	}
	c, err := net.DialTimeout("tcp", host, 3*time.Second)
	if err != nil {
		unavailable(t, "RabbitMQ", err, startRabbitMQ)
	}
	_ = c.Close()
	return u.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
