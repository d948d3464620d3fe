package dialect

import (
	"database/sql/driver"
	"strings"
)

// TextArray is a list of strings sent to PostgreSQL as one parameter: an
// array literal, every element quoted, for a statement that casts it
// (CAST(? AS text[])) and reads it with unnest. GORM expands a plain slice
// into a list of placeholders, one per element, which makes each length
// another statement; a TextArray keeps the statement's text the same
// whatever the length, and lets the statement probe an index once per
// element (unnest ... CROSS JOIN LATERAL) rather than leave the planner to
// choose between probes and a scan.
type TextArray []string

// arrayEscaper escapes what a quoted element of an array literal may not
// hold bare.
var arrayEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`)

// Value implements driver.Valuer: the array literal, such as {"a","b"}.
func (a TextArray) Value() (driver.Value, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range a {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		_, _ = arrayEscaper.WriteString(&b, s)
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String(), nil
}
