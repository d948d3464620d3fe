package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
)

// CSRF protection is a signed double-submit cookie: the first page a
// browser loads sets an HttpOnly, SameSite=Strict cookie holding a random
// nonce, and every form carries HMAC-SHA256(secret, nonce) as a hidden
// field. A POST must carry both, and the field must match the cookie, so a
// page on another site can neither read the token nor forge one. On top of
// that, cross-origin browser requests are refused by their Sec-Fetch-Site
// or Origin header (net/http's CrossOriginProtection).

const (
	// csrfCookie names the cookie holding the nonce.
	csrfCookie = "bento_console_csrf"
	// csrfField names the form field holding the token.
	csrfField = "csrf_token"
	// maxFormBytes bounds a POST body: the forms carry a token and a few
	// short fields.
	maxFormBytes = 16 << 10
)

// csrfToken returns the token the forms on this page carry, setting the
// nonce cookie first when the browser has none.
func (c *Console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(csrfCookie); err == nil && validNonce(ck.Value) {
		return c.sign(ck.Value)
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never returns an error
	nonce := hex.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{
		Name:     csrfCookie,
		Value:    nonce,
		Path:     mountPrefix(r) + "/",
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteStrictMode,
	})
	return c.sign(nonce)
}

func validNonce(s string) bool {
	if len(s) != 32 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func (c *Console) sign(nonce string) string {
	m := hmac.New(sha256.New, c.cfg.Secret)
	m.Write([]byte("bento console csrf\x00"))
	m.Write([]byte(nonce))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkPost vets a POST before anything changes: not read-only, not
// cross-origin, and a token matching the cookie. It answers 403 with the
// reason and returns false when the request is refused.
func (c *Console) checkPost(w http.ResponseWriter, r *http.Request) bool {
	if c.cfg.ReadOnly {
		c.forbidden(w, r, "This console is read-only: requeue and discard are turned off.")
		return false
	}
	if err := c.xorig.Check(r); err != nil {
		c.forbidden(w, r, "Cross-origin request refused: the console only accepts forms posted from its own pages.")
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		c.renderError(w, r, http.StatusBadRequest, "Bad form: "+err.Error())
		return false
	}
	ck, err := r.Cookie(csrfCookie)
	if err != nil || !validNonce(ck.Value) {
		c.forbidden(w, r, "Missing CSRF cookie: load the console page again and retry.")
		return false
	}
	token := r.PostForm.Get(csrfField)
	if token == "" || !hmac.Equal([]byte(token), []byte(c.sign(ck.Value))) {
		c.forbidden(w, r, "Missing or invalid CSRF token: the request did not come from a console form. Load the page again and retry.")
		return false
	}
	return true
}

// mutation wraps a POST handler with checkPost.
func (c *Console) mutation(fn http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c.checkPost(w, r) {
			fn(w, r)
		}
	}
}

func (c *Console) forbidden(w http.ResponseWriter, r *http.Request, msg string) {
	c.renderError(w, r, http.StatusForbidden, "Forbidden. "+msg)
}
