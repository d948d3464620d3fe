// Package doccheck keeps the repository's Markdown honest. Its tests read
// README.md, CHANGELOG.md and docs/*.md and fail when a code fence is left
// open or closed mid-line, a relative link or a named file is missing, a
// symbol or test named as `package.Name` does not exist, a Go code block
// does not type-check against the packages it uses, or a document cites
// something outside the repository. The package has no API: it exists for
// its tests, which scripts/test.sh runs with the others.
package doccheck
