//go:build unix && !linux

package harness

import "syscall"

// sysProcAttr puts the child in its own process group. Without PR_SET_PDEATHSIG
// outside Linux, a harness killed with -9 leaves its children running.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
