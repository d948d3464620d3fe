package health_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/bentoevents/bento/health"
)

// Ready answers 503 and names the check that failed; Live answers 200 as
// long as the process serves.
func ExampleReady() {
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", health.Live())
	mux.Handle("GET /readyz", health.Ready(nil,
		health.Check{Name: "cache", Run: func(context.Context) error { return nil }},
		health.Check{Name: "search", Run: func(context.Context) error { return errors.New("index not loaded") }},
	))
	for _, path := range []string{"/healthz", "/readyz"} {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		fmt.Println(path, w.Code)
	}
	// Output:
	// /healthz 200
	// /readyz 503
}
