package bench

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Machine describes where the numbers were measured.
type Machine struct {
	CPUs        int
	CPUModel    string
	MemTotal    string
	Kernel      string
	Go          string
	Server      string // SELECT VERSION()
	Settings    []string
	LoadAvg     string
	CPUPressure string
}

// DescribeMachine reads the machine and the server's version and relevant settings.
func DescribeMachine(ctx context.Context, db *sql.DB) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "MemTotal:") {
				f := strings.Fields(l)
				if len(f) >= 2 {
					kb, _ := strconv.ParseFloat(f[1], 64)
					m.MemTotal = fmt.Sprintf("%.1f GiB", kb/1024/1024)
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.LoadAvg, m.CPUPressure = MachineLoad()
	_ = db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&m.Server)
	for _, v := range []string{"innodb_flush_log_at_trx_commit", "sync_binlog", "log_bin", "innodb_buffer_pool_size",
		"innodb_autoinc_lock_mode", "max_connections", "thread_handling", "performance_schema"} {
		var name, val string
		if err := db.QueryRowContext(ctx, "SHOW GLOBAL VARIABLES LIKE '"+v+"'").Scan(&name, &val); err == nil {
			m.Settings = append(m.Settings, name+"="+val)
		}
	}
	return m
}

// MachineLoad returns the load average and the CPU pressure (PSI "some" avg10) right now:
// this machine is shared, and these say how much.
func MachineLoad() (loadavg, pressure string) {
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			loadavg = strings.Join(f[:3], " ")
		}
	}
	if b, err := os.ReadFile("/proc/pressure/cpu"); err == nil {
		for _, f := range strings.Fields(strings.SplitN(string(b), "\n", 2)[0]) {
			if strings.HasPrefix(f, "avg10=") {
				pressure = strings.TrimPrefix(f, "avg10=") + "% (some, avg10)"
			}
		}
	}
	return
}

// CPUClock reads CPU time used so far by this process and by the database server
// (when it runs on this machine and its pid file is readable; else zero).
type CPUClock struct {
	serverPID int
}

// NewCPUClock finds the server process through its pid file (SELECT @@pid_file): the
// machine may run other mariadbd processes (tests start private servers).
func NewCPUClock(ctx context.Context, db *sql.DB) *CPUClock {
	c := &CPUClock{}
	var path string
	if db == nil || db.QueryRowContext(ctx, "SELECT @@pid_file").Scan(&path) != nil {
		return c
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return c
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return c
	}
	if comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm")); err == nil {
		if n := strings.TrimSpace(string(comm)); n == "mariadbd" || n == "mysqld" {
			c.serverPID = pid
		}
	}
	return c
}

// Now returns (this process, the server) CPU time.
func (c *CPUClock) Now() (self, server time.Duration) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if c.serverPID > 0 {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.serverPID)); err == nil {
			s := string(b)
			if i := strings.LastIndexByte(s, ')'); i > 0 {
				f := strings.Fields(s[i+1:])
				if len(f) > 13 {
					ut, _ := strconv.ParseInt(f[11], 10, 64)
					st, _ := strconv.ParseInt(f[12], 10, 64)
					server = time.Duration(ut+st) * (time.Second / 100) // USER_HZ
				}
			}
		}
	}
	return
}
