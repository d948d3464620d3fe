package idempotency

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/bentoevents/bento/internal/dberr"
	"github.com/bentoevents/bento/outbox"
)

var (
	// ErrInvalidConfig is returned by New for a bad configuration; the
	// message names every bad field.
	ErrInvalidConfig = errors.New("idempotency: invalid config")
	// ErrNoCaller is returned (wrapped, with ErrInvalidConfig) by New for
	// a Config that sets neither Caller nor SingleCaller: keys must be
	// scoped by a caller the application names.
	ErrNoCaller = errors.New("idempotency: no caller: set Config.Caller to the authenticated caller's id, or Config.SingleCaller")
	// ErrInvalidKey is returned (wrapped) by ValidateKey for a malformed
	// key; the middleware answers such a request with 400.
	ErrInvalidKey = errors.New("idempotency: invalid key")
	// ErrClosed is outbox.ErrClosed, the one closed-database error: it is
	// returned (wrapped) when the database handle has been closed.
	ErrClosed = outbox.ErrClosed
	// ErrInvalidArgument is returned by Purge and CountExpired for an
	// argument out of range, such as a negative age.
	ErrInvalidArgument = errors.New("idempotency: invalid argument")
	// ErrNotMigrated is returned by New when the ledger's table does not
	// exist in the database: Migrate was not called.
	ErrNotMigrated = errors.New("idempotency: idempotency table missing: call idempotency.Migrate(ctx, db) first")
)

// Problem types: the "type" of the RFC 9457 problem details the middleware
// responds with. Each is the address of its own documentation.
const (
	// ProblemInvalidKey (400): the Idempotency-Key is empty, longer than 255
	// characters, not printable ASCII, or sent more than once.
	ProblemInvalidKey = "https://pkg.go.dev/github.com/bentoevents/bento/idempotency#ProblemInvalidKey"
	// ProblemBodyTooLarge (413): the request body is larger than
	// Config.MaxBodyBytes.
	ProblemBodyTooLarge = "https://pkg.go.dev/github.com/bentoevents/bento/idempotency#ProblemBodyTooLarge"
	// ProblemKeyReused (409): the key was used before with a different
	// request (method, path, query or body). Use a new key for a new
	// request.
	ProblemKeyReused = "https://pkg.go.dev/github.com/bentoevents/bento/idempotency#ProblemKeyReused"
	// ProblemInProgress (409): a request with the same key was still running
	// after Config.LockTimeout. Retry later with the same key.
	ProblemInProgress = "https://pkg.go.dev/github.com/bentoevents/bento/idempotency#ProblemInProgress"
	// ProblemNoCaller (401): Config.Caller could not tell who sent the
	// request (it returned an error or nothing). Nothing ran.
	ProblemNoCaller = "https://pkg.go.dev/github.com/bentoevents/bento/idempotency#ProblemNoCaller"
	// ProblemNotRecorded (500): the ledger could not record the request (a
	// database error, or the commit failed). Nothing was applied; retry with
	// the same key.
	ProblemNotRecorded = "https://pkg.go.dev/github.com/bentoevents/bento/idempotency#ProblemNotRecorded"
)

// problem is an RFC 9457 problem details object.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

var (
	problemKeyReused = problem{Type: ProblemKeyReused, Status: http.StatusConflict,
		Title:  "Idempotency-Key reused with a different request",
		Detail: "this Idempotency-Key was used before with a different method, path, query or body; use a new key for a new request"}
	problemInProgress = problem{Type: ProblemInProgress, Status: http.StatusConflict,
		Title:  "request with this Idempotency-Key still in progress",
		Detail: "a request with this Idempotency-Key did not finish in time; retry later with the same key"}
	problemNoCaller = problem{Type: ProblemNoCaller, Status: http.StatusUnauthorized,
		Title:  "caller unknown",
		Detail: "a request with an Idempotency-Key must come from an identified caller; nothing was run"}
	problemNotRecorded = problem{Type: ProblemNotRecorded, Status: http.StatusInternalServerError,
		Title:  "request not recorded",
		Detail: "the request could not be recorded and had no effect; retry with the same Idempotency-Key"}
)

func problemInvalidKey(err error) problem {
	return problem{Type: ProblemInvalidKey, Status: http.StatusBadRequest,
		Title: "invalid Idempotency-Key", Detail: err.Error()}
}

func problemBodyTooLarge(limit int64) problem {
	return problem{Type: ProblemBodyTooLarge, Status: http.StatusRequestEntityTooLarge,
		Title:  "request body too large",
		Detail: fmt.Sprintf("a request with an Idempotency-Key may have a body of at most %d bytes", limit)}
}

// aboutBlank is a problem with no type of its own, titled with the status
// text as RFC 9457 asks.
func aboutBlank(status int, detail string) problem {
	return problem{Type: "about:blank", Status: status, Title: http.StatusText(status), Detail: detail}
}

// write sends p as the response.
func (p problem) write(w http.ResponseWriter) {
	h := w.Header()
	h.Del("Content-Length")
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

func wrapDB(op string, err error) error { return dberr.Wrap("idempotency: "+op, err) }
