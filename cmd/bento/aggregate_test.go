package main

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestParseAggregate checks the --aggregate forms both dead-letter
// commands accept, and that a missing type is a usage error.
func TestParseAggregate(t *testing.T) {
	for _, c := range []struct{ in, typ, id string }{
		{"", "", ""}, {"order", "order", ""}, {"order/42", "order", "42"}, {"order/a/b", "order", "a/b"},
	} {
		typ, id, err := parseAggregate(c.in)
		if assert.NoError(t, err, c.in) {
			assert.Equal(t, [2]string{c.typ, c.id}, [2]string{typ, id}, c.in)
		}
	}
	_, _, err := parseAggregate("/42")
	var usage *usageError
	assert.True(t, errors.As(err, &usage), "got %v", err)
}
