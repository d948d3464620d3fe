//go:build !linux

package chaos

import "syscall"

// sysProcAttr has nothing to add off Linux: a test killed by its timeout
// may leave its campaign's processes running until their next restart
// fails.
func sysProcAttr() *syscall.SysProcAttr { return nil }
