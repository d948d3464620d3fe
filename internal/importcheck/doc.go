// Package importcheck keeps the repository's dependencies pointing one
// way: the packages under internal/ are machinery below the public API,
// and the tests of the public packages import them (internal/testenv
// above all), so an internal package that imported a public one would
// stand above the packages it serves, a step from an import cycle. Its
// test fails when a package under internal/ imports a bento package
// outside internal/ that is not on its short list of exceptions, each with
// its reason, and always when one depends on bentotest, the kit for
// users' tests, directly or not.
//
// The package has no API: it exists for its test, which scripts/test.sh
// runs with the others.
package importcheck
