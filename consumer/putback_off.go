//go:build !bento_putback

package consumer

// putBack names a fix to undo, for showing that the fault campaign (package
// chaos) finds the bug it fixed: only in binaries built with the
// bento_putback tag (see putback_on.go). In every other build it is the
// empty constant, and the branches that test it compile away.
const putBack = ""
