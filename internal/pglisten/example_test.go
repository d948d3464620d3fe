package pglisten_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/bentoevents/bento/internal/embeddb"
	"github.com/bentoevents/bento/internal/pglisten"
)

// A Listener wakes its owner on each notification. On a database without
// LISTEN (here SQLite) Run logs that its owner polls only and returns.
func Example() {
	dir, _ := os.MkdirTemp("", "pglisten")
	defer os.RemoveAll(dir)
	db, _ := embeddb.Open(filepath.Join(dir, "bento.db"), nil)
	sqlDB, _ := db.DB()
	defer sqlDB.Close()

	var log bytes.Buffer
	wake := make(chan struct{}, 1)
	l := pglisten.Listener{
		Channel:  "bento_example",
		OnListen: func(string) { wake <- struct{}{} },
		OnNotify: func(string, string) { wake <- struct{}{} },
		Logger:   slog.New(slog.NewTextHandler(&log, nil)),
		Prefix:   "example: ",
	}
	l.Run(context.Background(), sqlDB)
	fmt.Println(strings.Contains(log.String(), "example: cannot listen; polling only"), len(wake))
	// Output: true 0
}
