package idempotency_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/bentoevents/bento/idempotency"
)

// TestValidateKey checks the key grammar: 1 to 255 printable ASCII
// characters.
func TestValidateKey(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"a", "8e03978e-40d5-43e8-bc93-6894a57f9324", `"quoted"`, " ~!", strings.Repeat("x", 255)} {
		assert.NoError(t, idempotency.ValidateKey(ok), "%q", ok)
	}
	for _, bad := range []string{"", strings.Repeat("x", 256), "a\tb", "a\x00", "a\x7f", "ключ", "caf\xe9"} {
		assert.ErrorIs(t, idempotency.ValidateKey(bad), idempotency.ErrInvalidKey, "%q", bad)
	}
}

// TestRequestDigest checks that the digest is hex SHA-256 and tells apart
// requests whose fields would run together without length prefixes.
func TestRequestDigest(t *testing.T) {
	t.Parallel()
	d := idempotency.RequestDigest(http.MethodPost, "/a", []byte("b"))
	assert.Len(t, d, 64)
	assert.Equal(t, d, idempotency.RequestDigest(http.MethodPost, "/a", []byte("b")))
	seen := map[string]string{}
	for name, got := range map[string]string{
		"base":        d,
		"moved byte":  idempotency.RequestDigest(http.MethodPost, "/ab", nil),
		"method/path": idempotency.RequestDigest("POST/", "a", []byte("b")),
		"method":      idempotency.RequestDigest(http.MethodPut, "/a", []byte("b")),
		"query":       idempotency.RequestDigest(http.MethodPost, "/a?", []byte("b")),
		"empty body":  idempotency.RequestDigest(http.MethodPost, "/a", []byte{}),
	} {
		if prev, dup := seen[got]; dup {
			t.Errorf("%s and %s share a digest", name, prev)
		}
		seen[got] = name
	}
	assert.Equal(t, idempotency.RequestDigest("GET", "/", nil), idempotency.RequestDigest("GET", "/", []byte{}))
}
