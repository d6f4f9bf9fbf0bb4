package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// Binaries are the two programs the harness runs.
type Binaries struct {
	Dir       string
	Batcherd  string // batcherd
	GitLabSim string // gitlab-sim
}

// Prebuilt returns the binaries already in dir, or an error naming what is missing.
func Prebuilt(dir string) (*Binaries, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	b := &Binaries{Dir: abs, Batcherd: filepath.Join(abs, "batcherd"), GitLabSim: filepath.Join(abs, "gitlab-sim")}
	for _, p := range []string{b.Batcherd, b.GitLabSim} {
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("%s is missing or not executable (run 'make build')", p)
		}
	}
	return b, nil
}

var (
	buildMu    sync.Mutex
	buildCache = map[string]*Binaries{}
)

// Build compiles cmd/batcherd and cmd/gitlab-sim of the module this process runs in
// (found with `go env GOMOD` from the working directory) into dir. race builds them
// with the race detector (needs cgo). A process builds each (dir, race) once; later
// calls return the cached result.
func Build(ctx context.Context, dir string, race bool) (*Binaries, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	key := fmt.Sprintf("%s|%v", abs, race)
	buildMu.Lock()
	defer buildMu.Unlock()
	if b, ok := buildCache[key]; ok {
		return b, nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, errors.New("the go command is not on PATH: the harness builds batcherd with it")
	}
	root, err := ModuleRoot(ctx)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, err
	}
	args := []string{"build", "-o", abs + string(filepath.Separator)}
	if race {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/batcherd", "./cmd/gitlab-sim")
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = root
	cmd.Env = os.Environ()
	if race {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=1")
	} else {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	b, err := Prebuilt(abs)
	if err != nil {
		return nil, err
	}
	buildCache[key] = b
	return b, nil
}

// ModuleRoot is the directory of the main module's go.mod.
func ModuleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the batcherd module: run from the repository")
	}
	return filepath.Dir(mod), nil
}
