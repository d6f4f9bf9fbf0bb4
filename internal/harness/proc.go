package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Process is one child process in its own process group, with stdout and stderr
// appended to a log file.
type Process struct {
	Name    string
	LogPath string

	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}

	mu      sync.Mutex
	waitErr error
}

// live is every process started and not yet reaped, so KillAll can end them.
var live sync.Map // *Process → struct{}

// startProcess starts path with args and env (the complete environment), appending
// its output to logPath.
func startProcess(name, path string, args, env []string, logPath string) (*Process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "=== %s: %s %v (started %s)\n", name, path, args, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, log: f, done: make(chan struct{})}
	live.Store(p, struct{}{})
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		fmt.Fprintf(f, "=== %s: exited: %s (%s)\n", name, exitText(cmd.ProcessState), time.Now().Format(time.RFC3339Nano))
		f.Close()
		live.Delete(p)
		close(p.done)
	}()
	return p, nil
}

func exitText(ps *os.ProcessState) string {
	if ps == nil {
		return "unknown"
	}
	return ps.String()
}

// Pid is the process id (also its process group id).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitCode is the exit code once exited: -1 while running or when killed by a signal.
func (p *Process) ExitCode() int {
	if !p.Exited() {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// State describes how the process ended ("exit status 0", "signal: killed"), or
// "running".
func (p *Process) State() string {
	if !p.Exited() {
		return "running"
	}
	return p.cmd.ProcessState.String()
}

// Signal sends sig to the whole process group.
func (p *Process) Signal(sig syscall.Signal) error {
	if p.Exited() {
		return nil
	}
	err := syscall.Kill(-p.Pid(), sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// Kill sends SIGKILL to the process group and waits until the process is reaped.
func (p *Process) Kill() error {
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.done
	return nil
}

// Stop sends SIGTERM to the process group and waits up to grace for the exit, then
// kills the group. It returns the exit code (-1 when it had to be killed).
func (p *Process) Stop(grace time.Duration) (int, error) {
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return -1, err
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		// Leftover children of the group (there should be none) go too.
		_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
		return p.ExitCode(), nil
	case <-t.C:
		_ = p.Kill()
		return -1, fmt.Errorf("%s did not exit within %s of SIGTERM; killed", p.Name, grace)
	}
}

// KillAll sends SIGKILL to every process group the harness started and has not yet
// reaped. For signal handlers of programs built on the harness (the demo): normal
// code calls Cluster.Close.
func KillAll() {
	live.Range(func(k, _ any) bool {
		_ = k.(*Process).Signal(syscall.SIGKILL)
		return true
	})
}
