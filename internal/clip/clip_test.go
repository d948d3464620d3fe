package clip_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"

	"github.com/bentoevents/bento/internal/clip"
)

func TestStringKeepsShortValues(t *testing.T) {
	for _, s := range []string{"", "order.paid", strings.Repeat("a", clip.Max)} {
		assert.Equal(t, s, clip.String(s))
	}
}

func TestStringCutsLongValues(t *testing.T) {
	long := strings.Repeat("a", clip.Max+1)
	assert.Equal(t, long[:clip.Max]+"...", clip.String(long))
}

// TestStringCutsOnACharacter checks that a multi-byte character straddling
// the limit is dropped whole, leaving valid UTF-8.
func TestStringCutsOnACharacter(t *testing.T) {
	s := strings.Repeat("a", clip.Max-1) + "é" + "tail"
	got := clip.String(s)
	assert.True(t, utf8.ValidString(got), "%q", got)
	assert.Equal(t, strings.Repeat("a", clip.Max-1)+"...", got)
}
