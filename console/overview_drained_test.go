package console_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
)

// TestOverviewOfADrainedOutbox shows the backlog of a tenant with nothing
// pending or dead: the page says so, and does not call the outbox empty,
// since its sent rows, which the backlog does not count, may be many.
func TestOverviewOfADrainedOutbox(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		res, body := e.get(t, "/?tenant=drained")
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		assert.True(t, strings.Contains(body, "Nothing pending or dead."), "the backlog says nothing is pending")
		assert.False(t, strings.Contains(body, "empty"), "and does not call the outbox empty")
	})
}
