package harness

import "syscall"

// sysProcAttr puts the child in its own process group (so a signal reaches anything
// it starts) and has the kernel kill it if the harness dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
