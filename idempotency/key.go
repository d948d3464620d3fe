package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/url"
)

// HeaderKey is the request header that carries the idempotency key.
const HeaderKey = "Idempotency-Key"

// HeaderReplayed is the response header set to "true" on a replayed
// response.
const HeaderReplayed = "Idempotent-Replayed"

// MaxKeyLen is the longest key accepted, in characters (bytes: keys are
// ASCII).
const MaxKeyLen = 255

// ValidateKey returns nil if key is a well-formed idempotency key: 1 to
// [MaxKeyLen] characters of printable ASCII (0x20 to 0x7E). Otherwise it
// returns an error wrapping [ErrInvalidKey] that says what is wrong.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d characters, more than %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: byte 0x%02x at offset %d is not printable ASCII", ErrInvalidKey, c, i)
		}
	}
	return nil
}

// scopedKey is how a key is stored: as is for a request without a caller;
// for one with a caller, a digest of the caller between two 0x1f bytes
// (which no key holds), then the key. The caller is not stored in clear.
func scopedKey(scope, key string) string {
	if scope == "" {
		return key
	}
	sum := sha256.Sum256([]byte("bento-idempotency-scope-v1\x00" + scope))
	return "\x1f" + hex.EncodeToString(sum[:16]) + "\x1f" + key
}

// digestDomain versions the digest encoding: stored digests stay comparable
// only while it is unchanged.
const digestDomain = "bento-idempotency-digest-v1"

// RequestDigest returns the hex SHA-256 digest that identifies a request
// under its key: over method, target and body, each prefixed with its
// length (8 bytes, big-endian), so no two different requests share an
// encoding. target is the request's path with, when the URL has a query,
// "?" and the raw query: what [Ledger.Middleware] uses for r.URL.
func RequestDigest(method, target string, body []byte) string {
	h := sha256.New()
	var n [8]byte
	field := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	field([]byte(digestDomain))
	field([]byte(method))
	field([]byte(target))
	field(body)
	return hex.EncodeToString(h.Sum(nil))
}

// requestTarget is the target RequestDigest covers for u.
func requestTarget(u *url.URL) string {
	if u.RawQuery != "" || u.ForceQuery {
		return u.Path + "?" + u.RawQuery
	}
	return u.Path
}
