package command

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"golang.org/x/sys/unix"

	"github.com/jetfleet/jetfleet/pkg/agent"
)

// Variables of the job's metadata in the program's environment.
const (
	EnvJobID        = "JETFLEET_JOB_ID"
	EnvKind         = "JETFLEET_KIND"
	EnvQueue        = "JETFLEET_QUEUE"
	EnvAttempt      = "JETFLEET_ATTEMPT"
	EnvMaxAttempts  = "JETFLEET_MAX_ATTEMPTS"
	EnvDeadline     = "JETFLEET_DEADLINE"
	EnvScheduleID   = "JETFLEET_SCHEDULE_ID"
	EnvNominalTime  = "JETFLEET_NOMINAL_TIME"
	EnvReplayedFrom = "JETFLEET_REPLAYED_FROM"
	// EnvIdempotencyKey and EnvAttemptKey identify the job's run and the
	// attempt (agent.Job.IdempotencyKey and AttemptKey).
	EnvIdempotencyKey = "JETFLEET_IDEMPOTENCY_KEY"
	EnvAttemptKey     = "JETFLEET_ATTEMPT_KEY"
	// EnvResult names a file the program may write its result to: a JSON
	// document, recorded (agent.RecordResult) when the program succeeds.
	EnvResult      = "JETFLEET_RESULT"
	EnvTraceParent = "TRACEPARENT"
	EnvTraceState  = "TRACESTATE"
)

// Handler runs a configured program for each job. Use its Run method as
// the kind's agent.Handler, and Close it once the agent has stopped.
type Handler struct {
	cfg Config

	mu       sync.Mutex
	running  map[int]struct{} // process groups of running attempts
	attempts sync.WaitGroup   // running attempts, for Close
	closed   bool
	stopping atomic.Bool // BeginShutdown was called
}

// ShutdownKillGrace caps kill_grace once BeginShutdown was called: a
// stopping agent gives handlers of jobs it hands back a second to return,
// and a job whose process group is gone by then is handed back cleanly,
// without spending an attempt.
const ShutdownKillGrace = 500 * time.Millisecond

// BeginShutdown tells the handler that the agent is stopping: from now on
// SIGKILL follows SIGTERM after at most ShutdownKillGrace. Call it before
// stopping the agent.
func (h *Handler) BeginShutdown() { h.stopping.Store(true) }

// killGrace is the time between SIGTERM and SIGKILL now.
func (h *Handler) killGrace() time.Duration {
	if h.stopping.Load() {
		return min(h.cfg.KillGrace, ShutdownKillGrace)
	}
	return h.cfg.KillGrace
}

// New checks cfg and the program it names. Resource limits need the
// launcher: RunLauncherIfRequested must have run at the start of main.
func New(cfg Config) (*Handler, error) {
	if err := cfg.Validate("exec"); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	st, err := os.Stat(cfg.Command)
	if err != nil {
		return nil, fmt.Errorf("command %s: %w", cfg.Command, err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("command %s is not an executable file", cfg.Command)
	}
	if cfg.Dir != "" {
		if st, err := os.Stat(cfg.Dir); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("dir %s is not a directory", cfg.Dir)
		}
	} else {
		// Each attempt gets a directory under $TMPDIR: check it can.
		tmp, err := os.MkdirTemp("", "jetfleet-job-")
		if err != nil {
			return nil, fmt.Errorf("no dir configured and no directory can be made under %s (set dir or TMPDIR): %w", os.TempDir(), err)
		}
		_ = os.Remove(tmp)
	}
	if !cfg.Limits.IsZero() && !launcherInstalled.Load() {
		return nil, errors.New("resource limits need command.RunLauncherIfRequested() at the start of main (or TestMain)")
	}
	return &Handler{cfg: cfg, running: map[int]struct{}{}}, nil
}

// Config is the handler's configuration, defaults applied.
func (h *Handler) Config() Config { return h.cfg }

// ExitError is an attempt whose program exited with a non-zero code or
// was killed by a signal it did not get from the handler.
type ExitError struct {
	// Code is the exit code, or -1 when a signal ended the program.
	Code int
	// Signal ended the program, when Code is -1.
	Signal syscall.Signal
	// Hint says what probably sent the signal.
	Hint string
}

func (e *ExitError) Error() string {
	if e.Code >= 0 {
		return "exit status " + strconv.Itoa(e.Code)
	}
	if e.Hint != "" {
		return fmt.Sprintf("killed by signal %s: %s", signalName(e.Signal), e.Hint)
	}
	return fmt.Sprintf("killed by signal %s (%s)", signalName(e.Signal), e.Signal)
}

// Run runs the program for job: payload on stdin, metadata in the
// environment, output into the job's output tail. See the package
// documentation for how the result maps to the job's outcome.
func (h *Handler) Run(ctx context.Context, job *agent.Job) error {
	dir := h.cfg.Dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "jetfleet-job-")
		if err != nil {
			return fmt.Errorf("exec: working directory: %w", err)
		}
		defer func() { _ = os.RemoveAll(tmp) }() // a temporary directory left behind does not fail the job
		dir = tmp
	}
	out := job.Output()
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("exec: stdin pipe: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		_ = stdinR.Close() // the pipe's creation error is the one returned
		_ = stdinW.Close()
		return fmt.Errorf("exec: output pipe: %w", err)
	}
	// The result file lives in a directory of its own, not in a configured
	// working directory that other attempts may share.
	resultDir, err := os.MkdirTemp("", "jetfleet-result-")
	if err != nil {
		closeAll(stdinR, stdinW, outR, outW)
		return fmt.Errorf("exec: result directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(resultDir) }()
	resultFile := filepath.Join(resultDir, "result.json")
	cmd := h.command(ctx, job, dir)
	cmd.Env = append(cmd.Env, EnvResult+"="+resultFile)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, outW, outW

	pgid, err := h.start(cmd)
	// The program has its own copies of the pipe ends it uses.
	closeAll(stdinR, outW)
	if err != nil {
		closeAll(stdinW, outR)
		return fmt.Errorf("exec: start %s: %w", h.cfg.Command, err)
	}
	defer h.end(pgid)

	var pipes sync.WaitGroup
	pipes.Go(func() {
		// A program that does not read its stdin gets EPIPE here once it
		// exits, or this write ends when the pipe is closed below.
		_, _ = stdinW.Write(job.Payload)
		_ = stdinW.Close()
	})
	pipes.Go(func() {
		// Lines that report progress are reported, not kept as output.
		lines := &progressLines{out: out, report: func(fraction float64, message string) {
			_ = agent.ReportProgress(ctx, fraction, message) // checked by ParseProgress; +WPI failures are the agent's to log
		}}
		_, _ = io.Copy(lines, outR)
		lines.flush()
	})
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	var waitErr, stopCause error
	var termSent time.Time
	select {
	case waitErr = <-exited:
	case <-ctx.Done():
		select {
		case waitErr = <-exited: // it finished just in time
		default:
			stopCause = context.Cause(ctx)
			termSent = time.Now()
			why := stopCause.Error()
			if errors.Is(stopCause, context.DeadlineExceeded) {
				why = "the attempt timed out"
			}
			fmt.Fprintf(out, "\n[jetfleet: %s; SIGTERM sent to the process group", why)
			_ = signalGroup(pgid, syscall.SIGTERM)
			killGrace := h.killGrace()
			grace := time.NewTimer(killGrace)
			select {
			case waitErr = <-exited:
				fmt.Fprintf(out, "]\n")
			case <-grace.C:
				fmt.Fprintf(out, ", SIGKILL after %s]\n", killGrace)
				_ = signalGroup(pgid, syscall.SIGKILL)
				waitErr = <-exited
			}
			grace.Stop()
		}
	}

	// The leader is gone; what it started may not be.
	left, gone := killGroup(pgid, termSent, h.killGrace())
	if left > 0 && stopCause == nil {
		fmt.Fprintf(out, "\n[jetfleet: the program exited and left %d processes running in its process group; they were killed]\n", left)
	}
	if !gone {
		fmt.Fprintf(out, "\n[jetfleet: processes of group %d survived SIGKILL]\n", pgid)
	}
	// Processes that left the group may still hold the pipes: stop waiting
	// for them.
	if !waitTimeout(&pipes, 100*time.Millisecond) {
		closeAll(stdinW, outR)
		pipes.Wait()
	}
	closeAll(outR)

	if stopCause != nil {
		return fmt.Errorf("exec: %s: process group terminated: %w", h.cfg.Command, stopCause)
	}
	if err := h.result(cmd.ProcessState, waitErr); err != nil {
		return err
	}
	return recordResultFile(ctx, resultFile)
}

// recordResultFile records what a program that succeeded wrote to its
// result file, if anything. A result that is not JSON, or too large, fails
// the attempt for good: running the program again would write it again.
func recordResultFile(ctx context.Context, path string) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("exec: read $%s: %w", EnvResult, err)
	}
	defer func() { _ = f.Close() }() // read only
	data, err := io.ReadAll(io.LimitReader(f, agent.MaxResult+1))
	if err != nil {
		return fmt.Errorf("exec: read $%s: %w", EnvResult, err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if len(data) > agent.MaxResult {
		return agent.NonRetryable(fmt.Errorf("exec: $%s: %w: more than %d bytes", EnvResult, agent.ErrResultTooLarge, agent.MaxResult))
	}
	if err := agent.RecordResult(ctx, json.RawMessage(data)); err != nil {
		return agent.NonRetryable(fmt.Errorf("exec: $%s: %w", EnvResult, err))
	}
	return nil
}

// command builds the exec.Cmd of one attempt: the program itself, or the
// launcher that sets the resource limits and then becomes the program.
func (h *Handler) command(ctx context.Context, job *agent.Job, dir string) *exec.Cmd {
	argv := append([]string{h.cfg.Command}, h.cfg.Args...)
	cmd := &exec.Cmd{Path: h.cfg.Command, Args: argv}
	if !h.cfg.Limits.IsZero() {
		cmd.Path = selfExe
		cmd.Args = append([]string{"jetfleet-exec-launcher"}, launcherArgs(h.cfg.Limits, h.cfg.Command, argv)...)
	}
	cmd.Env = h.environ(ctx, job)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true,
		// Should the agent die, the program dies too (its descendants
		// cannot be reached then: see the package documentation). The
		// kernel sends it when the thread that forked exits; Go keeps its
		// threads unless a goroutine locked to one exits, which the agent
		// does not do.
		Pdeathsig: syscall.SIGKILL,
	}
	return cmd
}

// environ is the program's whole environment: the inherited and configured
// variables, then the job's metadata, which wins.
func (h *Handler) environ(ctx context.Context, job *agent.Job) []string {
	env := map[string]string{}
	for _, name := range h.cfg.InheritEnv {
		if v, ok := os.LookupEnv(name); ok {
			env[name] = v
		}
	}
	maps.Copy(env, h.cfg.Env)
	if _, ok := env["PATH"]; !ok {
		env["PATH"] = DefaultPath
	}
	env[EnvJobID] = job.ID
	env[EnvKind] = job.Kind
	env[EnvQueue] = job.Queue
	env[EnvAttempt] = strconv.Itoa(job.Attempt)
	env[EnvMaxAttempts] = strconv.Itoa(job.MaxAttempts)
	env[EnvIdempotencyKey] = job.IdempotencyKey()
	env[EnvAttemptKey] = job.AttemptKey()
	if !job.Deadline.IsZero() {
		env[EnvDeadline] = job.Deadline.UTC().Format(time.RFC3339Nano)
	}
	if job.ScheduleID != "" {
		env[EnvScheduleID] = job.ScheduleID
	}
	if !job.NominalTime.IsZero() {
		env[EnvNominalTime] = job.NominalTime.UTC().Format(time.RFC3339Nano)
	}
	if job.ReplayedFrom != "" {
		env[EnvReplayedFrom] = job.ReplayedFrom
	}
	trace := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, trace)
	if v := trace.Get("traceparent"); v != "" {
		env[EnvTraceParent] = v
	}
	if v := trace.Get("tracestate"); v != "" {
		env[EnvTraceState] = v
	}
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// result maps how the program ended to the attempt's outcome.
func (h *Handler) result(state *os.ProcessState, waitErr error) error {
	if state == nil {
		return fmt.Errorf("exec: %s: %w", h.cfg.Command, waitErr)
	}
	ws, ok := state.Sys().(syscall.WaitStatus)
	if !ok {
		return fmt.Errorf("exec: %s: %s", h.cfg.Command, state)
	}
	if ws.Signaled() {
		return fmt.Errorf("exec: %s: %w", h.cfg.Command, &ExitError{Code: -1, Signal: ws.Signal(), Hint: h.signalHint(ws.Signal())})
	}
	return h.exitOutcome(ws.ExitStatus())
}

// exitOutcome maps an exit code: 0 succeeds, the configured lists decide,
// other codes follow other_exit_codes.
func (h *Handler) exitOutcome(code int) error {
	if code == 0 {
		return nil
	}
	err := fmt.Errorf("exec: %s: %w", h.cfg.Command, &ExitError{Code: code})
	switch {
	case slices.Contains(h.cfg.RetryableExitCodes, code):
		return err
	case slices.Contains(h.cfg.NonRetryableExitCodes, code):
		return agent.NonRetryable(err)
	case h.cfg.OtherExitCodes == ExitNonRetryable:
		return agent.NonRetryable(err)
	}
	return err
}

// signalHint says what probably sent sig, given the configured limits.
func (h *Handler) signalHint(sig syscall.Signal) string {
	l := h.cfg.Limits
	switch {
	case sig == syscall.SIGXCPU && l.CPUTime > 0:
		return fmt.Sprintf("CPU time limit of %s exceeded (limits.cpu_time)", time.Duration(cpuSeconds(l.CPUTime))*time.Second)
	case sig == syscall.SIGKILL && l.CPUTime > 0:
		return "killed from outside the agent, by the kernel's OOM killer, or past the CPU time limit (limits.cpu_time)"
	case sig == syscall.SIGKILL:
		return "killed from outside the agent, or by the kernel's OOM killer"
	case (sig == syscall.SIGSEGV || sig == syscall.SIGABRT || sig == syscall.SIGBUS) && l.Memory > 0:
		return fmt.Sprintf("possibly the memory limit of %d bytes (limits.memory)", l.Memory)
	case sig == syscall.SIGXFSZ:
		return "file size limit exceeded"
	}
	return ""
}

// start starts cmd and tracks its process group, unless the handler is closed.
func (h *Handler) start(cmd *exec.Cmd) (pgid int, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return 0, errors.New("handler closed")
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	h.running[cmd.Process.Pid] = struct{}{}
	h.attempts.Add(1)
	return cmd.Process.Pid, nil
}

func (h *Handler) end(pgid int) {
	h.mu.Lock()
	delete(h.running, pgid)
	h.mu.Unlock()
	h.attempts.Done()
}

// Close kills the process groups of attempts still running, at once with
// SIGKILL, refuses new attempts, and waits (a few seconds at most) until
// the killed attempts have ended. Call it after the agent has stopped: a
// graceful stop hands running jobs back, and any program that still runs
// then must not outlive the agent.
func (h *Handler) Close() {
	h.mu.Lock()
	h.closed = true
	groups := slices.Collect(maps.Keys(h.running))
	h.mu.Unlock()
	for _, pgid := range groups {
		_ = signalGroup(pgid, syscall.SIGKILL)
	}
	waitTimeout(&h.attempts, 5*time.Second)
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// waitTimeout waits for wg up to d and reports whether it finished.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

func signalName(sig syscall.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return name
	}
	return "signal " + strconv.Itoa(int(sig))
}
