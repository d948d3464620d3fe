// Package doccheck keeps the repository's Markdown honest. Its tests read
// README.md, CHANGELOG.md and docs/*.md and fail when a code fence is left
// open or closed mid-line, a relative link or a named file is missing, a
// symbol or test named as `package.Name` does not exist, or a document
// cites something outside the repository.
//
// Go code blocks must compile. A block may carry a marker on the line
// before its fence: <!-- excerpt: path --> says the block appears verbatim
// in that file of the repository (which the build compiles), and
// <!-- fragment --> says it uses names the prose defines, so it is only
// type-checked against the APIs it calls. An unmarked block must compile
// on its own. The code in package doc comments is type-checked the same
// way as a fragment.
//
// The package has no API: it exists for its tests, which scripts/test.sh
// runs with the others.
package doccheck
