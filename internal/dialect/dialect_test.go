package dialect_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/bentoevents/bento/internal/dialect"
)

func TestTuples(t *testing.T) {
	assert.Equal(t, "(?)", dialect.Tuples(1, 1))
	assert.Equal(t, "(?, ?, ?), (?, ?, ?)", dialect.Tuples(2, 3))
	assert.Equal(t, "", dialect.Tuples(0, 3))
	assert.Equal(t, "", dialect.Tuples(2, 0))
}
