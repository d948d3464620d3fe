// Package clip shortens a foreign string before it is quoted in an error
// message or recorded as a span attribute, so a huge or hostile value
// cannot flood a log line.
package clip

import "unicode/utf8"

// Max is the most bytes of a string String keeps.
const Max = 64

// String returns s unchanged when it is at most Max bytes long; otherwise
// its first Max bytes, cut back to a whole UTF-8 character, followed by
// "...".
func String(s string) string {
	if len(s) <= Max {
		return s
	}
	n := Max
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
