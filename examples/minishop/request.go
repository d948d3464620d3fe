package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"unicode/utf8"
)

// maxBody is the largest request body accepted: 64 KiB. The largest order
// it can hold (order.MaxItems lines) makes an event of a few KiB, far under
// the outbox's payload limit (outbox.DefaultMaxPayloadBytes, 1 MiB), so an
// accepted request never fails later for its size.
const maxBody = 64 << 10

// badRequest is a request refused before any command runs: its status and
// problem title, and what was wrong.
type badRequest struct {
	status int
	title  string
	detail string
}

func (e *badRequest) Error() string { return e.title + ": " + e.detail }

// decodeJSON reads r's body into v strictly: the body must be declared as
// application/json (UTF-8, the only charset JSON has), be at most maxBody
// bytes of valid UTF-8, and hold exactly one JSON object whose every field
// v knows, each once (encoding/json matches names without regard to case,
// so two names that differ only by case are one field given twice). It
// returns a *badRequest: 415, 413 or 400.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) *badRequest {
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if charset, ok := params["charset"]; err != nil || mt != "application/json" || ok && !strings.EqualFold(charset, "utf-8") {
		return &badRequest{http.StatusUnsupportedMediaType, "Unsupported media type",
			fmt.Sprintf("send the body as application/json, not %q", r.Header.Get("Content-Type"))}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &badRequest{http.StatusRequestEntityTooLarge, "Request body too large",
				fmt.Sprintf("the body is over %d bytes", maxBody)}
		}
		return &badRequest{http.StatusBadRequest, "Unreadable body", err.Error()}
	}
	malformed := func(detail string) *badRequest {
		return &badRequest{http.StatusBadRequest, "Malformed JSON", detail}
	}
	if !utf8.Valid(body) {
		return malformed("the body is not valid UTF-8")
	}
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return malformed("the body must be one JSON object")
	}
	if err := duplicateName(body); err != nil {
		return malformed(err.Error())
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return malformed(err.Error())
	}
	if _, err := dec.Token(); err != io.EOF {
		return malformed("data after the JSON object")
	}
	return nil
}

// duplicateName returns an error naming the first object member given twice
// in the JSON document body (names compared without regard to case), or a
// syntax error. It reads the document as tokens, so it holds one set of
// names per open object and nothing else.
func duplicateName(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var value func() error
	value = func() error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				name, err := dec.Token()
				if err != nil {
					return err
				}
				key := strings.ToLower(name.(string))
				if seen[key] {
					return fmt.Errorf("the member %q is given twice", name)
				}
				seen[key] = true
				if err := value(); err != nil {
					return err
				}
			}
		case json.Delim('['):
			for dec.More() {
				if err := value(); err != nil {
					return err
				}
			}
		default:
			return nil
		}
		_, err = dec.Token() // the closing delimiter
		return err
	}
	return value()
}
