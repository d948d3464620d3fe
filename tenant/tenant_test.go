package tenant_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/tenant"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"default", "acme", "a", "tenant-1.eu_west", strings.Repeat("x", 32)} {
		assert.NoError(t, tenant.Validate(ok), ok)
	}
	for _, bad := range []string{"", " acme", "acme corp", "-acme", ".acme", "tenant/1", "ünï", strings.Repeat("x", 33), "a\n"} {
		err := tenant.Validate(bad)
		require.ErrorIs(t, err, tenant.ErrInvalid, "%q", bad)
	}
}

func TestResolveOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	got, err := tenant.Resolve(ctx, "", "")
	require.NoError(t, err)
	assert.Equal(t, tenant.Default, got)

	got, _ = tenant.Resolve(ctx, "", "fallback")
	assert.Equal(t, "fallback", got)

	withCtx := tenant.With(ctx, "from-ctx")
	got, _ = tenant.Resolve(withCtx, "", "fallback")
	assert.Equal(t, "from-ctx", got)

	got, _ = tenant.Resolve(withCtx, "explicit", "fallback")
	assert.Equal(t, "explicit", got)

	_, err = tenant.Resolve(tenant.With(ctx, "bad tenant"), "", "")
	require.ErrorIs(t, err, tenant.ErrInvalid)

	id, ok := tenant.From(withCtx)
	assert.True(t, ok)
	assert.Equal(t, "from-ctx", id)
	_, ok = tenant.From(ctx)
	assert.False(t, ok)
}

func ExampleResolve() {
	ctx := tenant.With(context.Background(), "acme")
	id, err := tenant.Resolve(ctx, "", "")
	fmt.Println(id, err)
	_, err = tenant.Resolve(ctx, "not valid!", "")
	fmt.Println(errors.Is(err, tenant.ErrInvalid))
	// Output:
	// acme <nil>
	// true
}
