package testenv_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/testenv"
)

// TestHelperNeedsPostgres is run as a subprocess by TestUnreachableService;
// on its own it is a no-op.
func TestHelperNeedsPostgres(t *testing.T) {
	if os.Getenv("BENTO_TESTENV_HELPER") == "" {
		return
	}
	testenv.Postgres(t)
	t.Log("reached PostgreSQL")
}

// TestUnreachableService checks the contract for tests whose service is
// down: skip with instructions outside CI, fail in CI, and refuse any
// non-loopback target.
func TestUnreachableService(t *testing.T) {
	t.Parallel()
	run := func(dsn string, ci bool) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperNeedsPostgres$", "-test.v")
		env := []string{"BENTO_TESTENV_HELPER=1", "BENTO_TEST_POSTGRES_DSN=" + dsn}
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "CI=") && !strings.HasPrefix(kv, "BENTO_TEST_POSTGRES_DSN=") {
				env = append(env, kv)
			}
		}
		if ci {
			env = append(env, "CI=true")
		}
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// Port 1 on loopback: nothing listens there.
	down := "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2"

	out, err := run(down, false)
	require.NoError(t, err, out)
	assert.Contains(t, out, "--- SKIP")
	assert.Contains(t, out, "pg_ctlcluster", "the skip says how to start the service")

	out, err = run(down, true)
	require.Error(t, err, "in CI an unreachable service fails the test")
	assert.Contains(t, out, "--- FAIL")
	assert.Contains(t, out, "CI is set")

	out, err = run("postgres://postgres@192.0.2.1:5432/test?sslmode=disable", false)
	require.Error(t, err)
	assert.Contains(t, out, "not a loopback address")
}
