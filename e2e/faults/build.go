package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// binaries are the programs a fleet runs, built from this checkout.
type binaries struct {
	natsServer, agent, scheduler, supervisor, jetfleet string
}

// repoRoot finds the repository's root (the directory holding go.work and
// services/) from the working directory upwards.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		_, errWork := os.Stat(filepath.Join(dir, "go.work"))
		_, errServices := os.Stat(filepath.Join(dir, "services"))
		if errWork == nil && errServices == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run from inside the jetfleet repository: no directory above the working directory holds go.work and services/")
		}
		dir = parent
	}
}

// build compiles the services and nats-server (the version pkg/go.mod
// requires, as `go tool task build` does) into dir, statically.
func build(ctx context.Context, log *slog.Logger, root, dir string) (binaries, error) {
	start := time.Now()
	steps := [][]string{
		{"go", "build", "-o", dir + "/", "./services/agent", "./services/scheduler", "./services/supervisor", "./services/jetfleet"},
		{"go", "build", "-o", filepath.Join(dir, "nats-server"), "github.com/nats-io/nats-server/v2"},
	}
	for _, args := range steps {
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // gone with the harness
		if out, err := cmd.CombinedOutput(); err != nil {
			return binaries{}, fmt.Errorf("build failed (%s, in %s): %w\n%s", strings.Join(args, " "), root, err, out)
		}
	}
	log.Info("built nats-server and the services", "dir", dir, "took", time.Since(start).Round(100*time.Millisecond))
	return binaries{
		natsServer: filepath.Join(dir, "nats-server"),
		agent:      filepath.Join(dir, "agent"),
		scheduler:  filepath.Join(dir, "scheduler"),
		supervisor: filepath.Join(dir, "supervisor"),
		jetfleet:   filepath.Join(dir, "jetfleet"),
	}, nil
}
