package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RunWithBinary is the TestMain of a command's package whose tests drive the
// built program: it builds the main package in the current directory as
// name in a temporary directory, sets *path to it, runs the tests, removes
// the directory and returns the exit code for os.Exit.
func RunWithBinary(m *testing.M, name string, path *string) int {
	dir, err := os.MkdirTemp("", name+"-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	*path = filepath.Join(dir, name)
	build := exec.Command("go", "build", "-o", *path, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "build %s: %v\n", name, err)
		return 1
	}
	return m.Run()
}
