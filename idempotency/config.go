package idempotency

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"time"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/tenant"
)

// Defaults of [Config].
const (
	DefaultTTL          = 24 * time.Hour
	DefaultMaxBodyBytes = 1 << 20 // 1 MiB
	DefaultLockTimeout  = 5 * time.Second
)

// maxLockTimeout is the longest lock_timeout (PostgreSQL) and busy_timeout
// (SQLite) accepted: 2^31-1 milliseconds.
const maxLockTimeout = math.MaxInt32 * time.Millisecond

// defaultStoredHeaders are the response headers stored and replayed when
// Config.StoredHeaders is empty. Never modified.
var defaultStoredHeaders = []string{"Content-Type", "Location", "Content-Location", "ETag", "Last-Modified"}

// Config configures a [Ledger]. It must name its callers: set Caller, or
// SingleCaller (New returns [ErrNoCaller] otherwise). Any other zero field
// means the field's default; negative durations and sizes, malformed header
// names, and Caller with SingleCaller, are rejected with [ErrInvalidConfig]
// naming the field.
type Config struct {
	// TTL is how long a key is remembered after its first request. A repeat
	// within TTL is replayed (or refused with 409 if the request differs);
	// after it, the key is new again. Defaults to DefaultTTL (24h).
	TTL time.Duration
	// MaxBodyBytes is the largest request body accepted with a key; larger
	// ones get 413. The body is read into memory to compute the request
	// digest. Defaults to DefaultMaxBodyBytes (1 MiB).
	MaxBodyBytes int64
	// LockTimeout is how long a request waits for a concurrent request with
	// the same key to finish (on SQLite: for the database's write lock)
	// before it gets 409. Rounded up to whole milliseconds. Defaults to
	// DefaultLockTimeout (5s).
	LockTimeout time.Duration
	// StoredHeaders are the response headers stored with a key and replayed
	// with its response; the first response carries all the handler's
	// headers. Defaults to Content-Type, Location, Content-Location, ETag and
	// Last-Modified.
	StoredHeaders []string
	// Tenant returns the tenant of a request; keys are scoped by tenant. An
	// empty result means "default". Defaults to the tenant carried by the
	// request's context (tenant.From), then "default".
	Tenant func(*http.Request) string
	// Caller returns who sent the request: keys are scoped by caller
	// within a tenant, so a caller who reuses or guesses another's key
	// runs a request of its own and never gets the other's response. Return
	// what stays the same across the caller's retries and only that caller
	// can present: the authenticated user's or client's id (a bearer
	// token's subject or client id, a session's user id, a client
	// certificate's subject), never a credential that changes over a
	// session such as the token itself, whose refresh between an attempt
	// and its retry would run the command twice. The package documentation
	// (# Callers) has examples.
	//
	// A request with a key whose Caller returns an error or an empty
	// string gets 401 ([ProblemNoCaller]) and runs nothing; the error is
	// logged, not sent. Caller is required unless SingleCaller is set.
	Caller func(*http.Request) (string, error)
	// SingleCaller says every request of a tenant comes from one caller
	// and shares its keys: for a machine-to-machine API with a single
	// client, or one that authenticates nobody. Set it instead of Caller,
	// never with it; with neither, New returns ErrNoCaller.
	SingleCaller bool
	// Clock is the clock for created_at, expires_at and expiry checks.
	// Defaults to aggregate.SystemClock.
	Clock aggregate.Clock
	// Logger receives a line per database error and per refused or replayed
	// request. Defaults to slog.Default().
	Logger *slog.Logger
}

// validate returns every problem with c, naming the fields.
func (c *Config) validate() error {
	var errs []error
	if c.TTL < 0 {
		errs = append(errs, fmt.Errorf("TTL: %v is negative", c.TTL))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxBodyBytes: %d is negative", c.MaxBodyBytes))
	}
	if c.LockTimeout < 0 {
		errs = append(errs, fmt.Errorf("LockTimeout: %v is negative", c.LockTimeout))
	}
	if c.LockTimeout > maxLockTimeout {
		errs = append(errs, fmt.Errorf("LockTimeout: %v is more than the databases accept (%v)", c.LockTimeout, maxLockTimeout))
	}
	for i, h := range c.StoredHeaders {
		if !validHeaderName(h) {
			errs = append(errs, fmt.Errorf("StoredHeaders[%d]: %q is not a valid header name", i, h))
		}
	}
	switch {
	case c.Caller == nil && !c.SingleCaller:
		errs = append(errs, ErrNoCaller)
	case c.Caller != nil && c.SingleCaller:
		errs = append(errs, errors.New("Caller: set with SingleCaller; choose one"))
	}
	return errors.Join(errs...)
}

// withDefaults returns c with its zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = DefaultLockTimeout
	}
	if len(c.StoredHeaders) == 0 {
		c.StoredHeaders = defaultStoredHeaders
	}
	canonical := make([]string, len(c.StoredHeaders))
	for i, h := range c.StoredHeaders {
		canonical[i] = http.CanonicalHeaderKey(h)
	}
	c.StoredHeaders = canonical
	if c.Tenant == nil {
		c.Tenant = tenantFromContext
	}
	if c.Clock == nil {
		c.Clock = aggregate.SystemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func tenantFromContext(r *http.Request) string {
	id, _ := tenant.From(r.Context())
	return id
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c < 0x80 && isTokenPunct(c):
		default:
			return false
		}
	}
	return true
}

func isTokenPunct(c byte) bool {
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}
