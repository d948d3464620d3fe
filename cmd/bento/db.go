package main

import (
	"context"
	"errors"
	"net/url"
	"regexp"
	"strings"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/outbox"
)

// connectTimeout bounds the first contact with the database.
const connectTimeout = 10 * time.Second

// open connects to DATABASE_URL and checks that the database answers. Every
// failure here is a usageError: the command cannot start.
func (c *cli) open(ctx context.Context) (*gorm.DB, error) {
	raw := strings.TrimSpace(c.getenv("DATABASE_URL"))
	if raw == "" {
		return nil, usagef("DATABASE_URL is not set: set it to postgres://user@host:5432/db or sqlite:PATH")
	}
	quiet := &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)}
	var db *gorm.DB
	var err error
	switch kind := databaseKind(raw); kind {
	case "postgres":
		if _, perr := url.Parse(raw); perr != nil && !strings.Contains(raw, "=") {
			return nil, usagef("DATABASE_URL %s is not a valid URL: %v", redact(raw), perr)
		}
		db, err = gorm.Open(postgres.Open(raw), quiet)
	case "sqlite":
		path := strings.TrimPrefix(strings.TrimPrefix(raw, "sqlite://"), "sqlite:")
		if path == "" {
			return nil, usagef("DATABASE_URL %q names no SQLite file: use sqlite:PATH", raw)
		}
		db, err = embedded.OpenSQLite(path, quiet)
	default:
		return nil, usagef("DATABASE_URL %s: unsupported database; use postgres://... or sqlite:PATH", redact(raw))
	}
	if err != nil { // the PostgreSQL driver connects at once
		return nil, usagef("cannot connect to DATABASE_URL %s: %v", redact(raw), err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, usagef("DATABASE_URL %s: %v", redact(raw), err)
	}
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := sqlDB.PingContext(pctx); err != nil {
		_ = sqlDB.Close()
		return nil, usagef("cannot connect to DATABASE_URL %s: %v", redact(raw), err)
	}
	return db, nil
}

// store opens the database and returns an outbox store over it.
func (c *cli) store(ctx context.Context) (*outbox.Store, func(), error) {
	db, err := c.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	if !db.Migrator().HasTable(&outbox.Message{}) {
		closeAll(db)
		return nil, nil, errors.New("the outbox_events table does not exist here: run bento migrate up")
	}
	st, err := outbox.NewStore(db, nil)
	if err != nil {
		closeAll(db)
		return nil, nil, err
	}
	return st, func() { closeAll(db) }, nil
}

// databaseKind tells which database a DATABASE_URL names: "postgres",
// "sqlite" or "" when it is neither.
func databaseKind(raw string) string {
	lower := strings.ToLower(raw)
	switch {
	case strings.HasPrefix(lower, "postgres://"), strings.HasPrefix(lower, "postgresql://"):
		return "postgres"
	case strings.HasPrefix(lower, "sqlite:"):
		return "sqlite"
	case strings.Contains(lower, "host=") || strings.Contains(lower, "dbname="):
		return "postgres" // libpq keyword/value string
	}
	return ""
}

var passwordKV = regexp.MustCompile(`(?i)(password=)\S+`)

// redact hides the password of a DATABASE_URL, for messages.
func redact(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		return u.Redacted()
	}
	return passwordKV.ReplaceAllString(raw, "${1}xxxxx")
}

// closeAll closes db's pool.
func closeAll(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}
