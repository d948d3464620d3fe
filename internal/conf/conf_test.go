package conf

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDefaultAndProblems(t *testing.T) {
	sentinel := errors.New("x: invalid config")
	var p Problems
	zero, set, neg := 0, 7, -3
	Default(&p, "Zero", &zero, 5)
	Default(&p, "Set", &set, 5)
	Default(&p, "Neg", &neg, 5)
	assert.Equal(t, 5, zero, "zero takes the default")
	assert.Equal(t, 7, set, "a set value stays")
	err := p.Err(sentinel)
	require.ErrorIs(t, err, sentinel)
	assert.Contains(t, err.Error(), "Neg: -3 is negative")
	assert.NotContains(t, err.Error(), "Zero")

	var none Problems
	assert.NoError(t, none.Err(sentinel))
}

func TestOrDefault(t *testing.T) {
	zero, neg, set := time.Duration(0), -time.Second, time.Minute
	OrDefault(&zero, time.Hour)
	OrDefault(&neg, time.Hour)
	OrDefault(&set, time.Hour)
	assert.Equal(t, time.Hour, zero)
	assert.Equal(t, -time.Second, neg, "negative stays: the field's none")
	assert.Equal(t, time.Minute, set)
}

func TestValue(t *testing.T) {
	type cfg struct{ N int }
	assert.Equal(t, cfg{}, Value[cfg](nil))
	in := &cfg{N: 3}
	out := Value(in)
	out.N = 4
	assert.Equal(t, 3, in.N, "a copy")
}
