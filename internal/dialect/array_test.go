package dialect_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/testenv"
)

func TestTextArrayLiteral(t *testing.T) {
	v, err := dialect.TextArray{"a", `b"c`, `d\e`}.Value()
	require.NoError(t, err)
	assert.Equal(t, `{"a","b\"c","d\\e"}`, v)
	v, err = dialect.TextArray{}.Value()
	require.NoError(t, err)
	assert.Equal(t, `{}`, v)
}

// TestTextArrayRoundTrip sends elements an array literal must quote or
// escape, and reads them back as PostgreSQL parsed them.
func TestTextArrayRoundTrip(t *testing.T) {
	db, _ := testenv.Postgres(t)
	in := dialect.TextArray{"plain", `quote"d`, `back\slash`, "comma,brace}{", "NULL", "", " spaced ", "ünï"}
	var out []string
	require.NoError(t, db.Raw(`SELECT x FROM unnest(CAST(? AS text[])) WITH ORDINALITY AS a(x, n) ORDER BY n`, in).Scan(&out).Error)
	assert.Equal(t, []string(in), out)
	var n int
	require.NoError(t, db.Raw(`SELECT count(*) FROM unnest(CAST(? AS text[])) AS a(x) WHERE x IS NULL`, in).Scan(&n).Error)
	assert.Zero(t, n, `the element "NULL" stays a string`)
}
