package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// procSpec says how to start one process.
type procSpec struct {
	// name identifies the process in logs and errors ("agent a1#2").
	name string
	path string
	args []string
	// env is the whole environment: nothing of the harness's own (no
	// JETFLEET_*, no OTEL_*) reaches a service.
	env []string
	// logPath receives stdout and stderr.
	logPath string
	// remember lists substrings whose first matching output line is kept
	// (see line).
	remember []string
}

// proc is one running (or exited) process.
type proc struct {
	spec    procSpec
	cmd     *exec.Cmd
	started time.Time
	// done is closed once the process exited; waitErr is then set.
	done    chan struct{}
	waitErr error
	// signalled is set when the harness sent it a signal that ends it.
	signalled atomic.Bool

	mu      sync.Mutex
	lines   map[string]string
	changed chan struct{}
}

// startProc starts spec's program in its own process group (a Ctrl-C at the
// terminal reaches only the harness, which stops everything in order) with
// SIGKILL as its parent-death signal (nothing outlives a harness that dies).
func startProc(spec procSpec) (*proc, error) {
	logFile, err := os.OpenFile(spec.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		_ = logFile.Close()
		return nil, err
	}
	p := &proc{spec: spec, done: make(chan struct{}), lines: map[string]string{}, changed: make(chan struct{})}
	p.cmd = exec.Command(spec.path, spec.args...)
	p.cmd.Env = spec.env
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		_ = pr.Close()
		_ = pw.Close()
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s (%s): %w", spec.name, spec.path, err)
	}
	p.started = time.Now()
	_ = pw.Close()
	go p.copyOutput(pr, logFile)
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// copyOutput writes the process's output to its log file, line by line,
// and keeps the first line matching each remembered substring.
func (p *proc) copyOutput(r io.ReadCloser, logFile *os.File) {
	defer func() { _ = r.Close(); _ = logFile.Close() }()
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for s.Scan() {
		line := s.Text()
		_, _ = logFile.WriteString(line + "\n")
		for _, sub := range p.spec.remember {
			if strings.Contains(line, sub) {
				p.mu.Lock()
				if _, ok := p.lines[sub]; !ok {
					p.lines[sub] = line
					close(p.changed)
					p.changed = make(chan struct{})
				}
				p.mu.Unlock()
			}
		}
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) String() string { return fmt.Sprintf("%s (pid %d)", p.spec.name, p.pid()) }

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// line waits until the process printed a line containing sub (one of
// spec.remember) and returns the first such line.
func (p *proc) line(ctx context.Context, sub string) (string, error) {
	for {
		p.mu.Lock()
		l, ok := p.lines[sub]
		changed := p.changed
		p.mu.Unlock()
		if ok {
			return l, nil
		}
		select {
		case <-changed:
		case <-p.done:
			return "", fmt.Errorf("%s exited (%v) before printing %q; last output:\n%s", p.spec.name, p.waitErr, sub, p.tail(20))
		case <-ctx.Done():
			return "", fmt.Errorf("%s printed no %q: %w", p.spec.name, sub, ctx.Err())
		}
	}
}

// signal sends sig to the process (not its group: the agents' programs
// are the agent's business).
func (p *proc) signal(sig syscall.Signal) error {
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		p.signalled.Store(true)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %v to %s: %w", sig, p, err)
	}
	return nil
}

// wait waits for the process to exit, at most timeout.
func (p *proc) wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%s did not exit within %s", p, timeout)
	}
}

// kill sends SIGKILL and waits until the process is gone.
func (p *proc) kill() error {
	if p.exited() {
		return nil
	}
	if err := p.signal(syscall.SIGKILL); err != nil && !p.exited() {
		return err
	}
	return p.wait(10 * time.Second)
}

// stop sends SIGTERM and waits up to grace, then kills.
func (p *proc) stop(grace time.Duration) error {
	if p.exited() {
		return nil
	}
	_ = p.signal(syscall.SIGTERM)
	if p.wait(grace) == nil {
		return nil
	}
	return p.kill()
}

// tail returns the last n lines of the process's log file.
func (p *proc) tail(n int) string {
	data, err := os.ReadFile(p.spec.logPath)
	if err != nil {
		return fmt.Sprintf("(log %s unreadable: %v)", p.spec.logPath, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// procSet holds every process a fleet started, so all of them end with it.
type procSet struct {
	mu    sync.Mutex
	procs []*proc
}

func (s *procSet) add(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.procs = append(s.procs, p)
}

// killAll kills every process still running.
func (s *procSet) killAll() {
	s.mu.Lock()
	procs := append([]*proc(nil), s.procs...)
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() { _ = p.kill() })
	}
	wg.Wait()
}
