package chaos

import "syscall"

// sysProcAttr makes the kernel kill a campaign's process when the test
// process dies, so that a test killed by its timeout leaves none behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
