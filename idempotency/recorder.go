package idempotency

import (
	"bytes"
	"fmt"
	"net/http"
)

// recorder is the http.ResponseWriter the handler writes to: it keeps the
// response until the ledger's transaction has committed. It behaves like
// net/http's writer where a handler can tell: the first WriteHeader wins,
// headers changed after it are not part of the response, Write without
// WriteHeader means 200, and statuses without a body refuse one.
// Informational (1xx) responses are dropped. It deliberately implements
// neither http.Flusher nor http.Hijacker nor Unwrap: nothing may reach the
// client before the commit.
type recorder struct {
	header http.Header
	sent   http.Header // header as of WriteHeader
	status int
	body   bytes.Buffer
}

func newRecorder() *recorder { return &recorder{header: http.Header{}} }

// Header returns the header map the handler sets before WriteHeader.
func (rw *recorder) Header() http.Header { return rw.header }

// WriteHeader records the status and the headers as they are now.
func (rw *recorder) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http
	}
	if rw.status != 0 || code < 200 {
		return
	}
	rw.status = code
	rw.sent = rw.header.Clone()
}

// Write records body bytes.
func (rw *recorder) Write(p []byte) (int, error) {
	if rw.status == 0 {
		rw.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(rw.status) {
		return 0, http.ErrBodyNotAllowed
	}
	return rw.body.Write(p)
}

// response is a complete HTTP response, recorded or stored.
type response struct {
	status int
	header http.Header
	body   []byte
}

// result returns the recorded response, with the Content-Type net/http
// would have sniffed when the handler set none, so that a replay says the
// same.
func (rw *recorder) result() response {
	if rw.status == 0 {
		rw.WriteHeader(http.StatusOK)
	}
	res := response{status: rw.status, header: rw.sent, body: rw.body.Bytes()}
	if _, set := res.header["Content-Type"]; !set && len(res.body) > 0 && res.header.Get("Transfer-Encoding") == "" {
		res.header.Set("Content-Type", http.DetectContentType(res.body))
	}
	return res
}

// writeTo sends res through w, adding extra headers.
func (res response) writeTo(w http.ResponseWriter, extra http.Header) {
	h := w.Header()
	for k, v := range res.header {
		h[k] = v
	}
	for k, v := range extra {
		h[k] = v
	}
	w.WriteHeader(res.status)
	if len(res.body) > 0 && bodyAllowed(res.status) {
		_, _ = w.Write(res.body)
	}
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
