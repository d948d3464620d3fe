// Package tenant carries the tenant id that scopes bento's rows (outbox
// events, inbox records, idempotency keys) and validates it.
//
// A tenant id is 1 to 32 characters: ASCII letters, digits, '_', '-' and '.',
// starting with a letter or digit. Code that does not use multi-tenancy never
// sees it: everything defaults to [Default].
package tenant

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/bentoevents/bento/internal/clip"
)

// Default is the tenant id used when none is given.
const Default = "default"

// MaxLen is the longest tenant id accepted.
const MaxLen = 32

// ErrInvalid is returned (wrapped) for a malformed tenant id.
var ErrInvalid = errors.New("tenant: invalid tenant id")

var pattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// Validate returns nil if id is a well-formed tenant id, otherwise an error
// wrapping [ErrInvalid] that says what is wrong.
func Validate(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", ErrInvalid)
	case len(id) > MaxLen:
		return fmt.Errorf("%w: %q is longer than %d characters", ErrInvalid, clip.String(id), MaxLen)
	case !pattern.MatchString(id):
		return fmt.Errorf("%w: %q must be ASCII letters, digits, '_', '-' or '.', starting with a letter or digit", ErrInvalid, clip.String(id))
	}
	return nil
}

type ctxKey struct{}

// With returns a copy of ctx that carries tenant id. The id is validated where
// it is used, not here.
func With(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// From returns the tenant id carried by ctx and whether there was one.
func From(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(ctxKey{}).(string)
	return id, ok
}

// Resolve picks the tenant id for an operation: explicit if not empty, else
// the one in ctx, else fallback if not empty, else [Default]. The result is
// validated.
func Resolve(ctx context.Context, explicit, fallback string) (string, error) {
	id := explicit
	if id == "" {
		id, _ = From(ctx)
	}
	if id == "" {
		id = fallback
	}
	if id == "" {
		id = Default
	}
	if err := Validate(id); err != nil {
		return "", err
	}
	return id, nil
}
