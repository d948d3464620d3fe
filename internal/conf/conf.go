// Package conf holds the one configuration convention of every bento Config:
// a nil config or a zero field takes the documented default, a negative
// value means "none" or "off" where a field's doc says so, and only
// contradictory or impossible values are errors, each naming its field.
package conf

import (
	"errors"
	"fmt"
)

// Number is the kind of field the helpers fill in.
type Number interface{ ~int | ~int64 }

// Problems collects what is wrong with a config, one error per field.
type Problems struct{ errs []error }

// Addf records a problem with field.
func (p *Problems) Addf(field, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
}

// Add records err as a problem with field.
func (p *Problems) Add(field string, err error) {
	p.errs = append(p.errs, fmt.Errorf("%s: %w", field, err))
}

// Err returns nil without problems, else an error wrapping sentinel and
// every problem.
func (p *Problems) Err(sentinel error) error {
	if len(p.errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", sentinel, errors.Join(p.errs...))
}

// Default sets a zero *v to def and records a problem for a negative one.
func Default[T Number](p *Problems, field string, v *T, def T) {
	switch {
	case *v == 0:
		*v = def
	case *v < 0:
		p.Addf(field, "%v is negative", *v)
	}
}

// OrDefault sets a zero *v to def. A negative value stays: it is the
// field's "none" or "off", which each use of the field reads as such.
func OrDefault[T Number](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// Value returns a copy of *c, or the zero T for a nil c: a nil config is a
// zero one.
func Value[T any](c *T) T {
	if c == nil {
		var zero T
		return zero
	}
	return *c
}
