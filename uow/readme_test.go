package uow_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestREADMEExampleMatchesExample keeps README.md's usage example compiling:
// the README block must be an exact, contiguous part of example_test.go,
// which is compiled and run as Example.
func TestREADMEExampleMatchesExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	example, err := os.ReadFile("example_test.go")
	require.NoError(t, err)

	text := string(readme)
	const open, fence = "<!-- bento:example -->\n```go\n", "```\n<!-- /bento:example -->"
	start := strings.Index(text, open)
	end := strings.Index(text, fence)
	require.True(t, start >= 0 && end > start, "README.md has no bento:example go block")
	block := text[start+len(open) : end]
	require.NotEmpty(t, strings.TrimSpace(block))
	require.Contains(t, string(example), block, "README example is not a verbatim part of uow/example_test.go")
}
