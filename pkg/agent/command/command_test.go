package command_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/agent/command"
	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// helperEnv makes the test binary, started by an exec handler, print what
// it got (helperReport) instead of running tests.
const helperEnv = "COMMAND_TEST_HELPER"

// Secrets in the agent's (this test process's) environment that no program may see.
const (
	agentSecret    = "agent-secret-value-7f3a"
	agentNATSToken = "nats-token-value-19bc"
)

func TestMain(m *testing.M) {
	command.RunLauncherIfRequested()
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	for k, v := range map[string]string{
		"AGENT_SECRET": agentSecret, "JETFLEET_NATS_TOKEN": agentNATSToken, "INHERITED_VAR": "passed on",
	} {
		if err := os.Setenv(k, v); err != nil {
			panic(err)
		}
	}
	natstest.VerifyNoLeaks(m)
}

// helperReport is what the helper program prints.
type helperReport struct {
	Args  []string `json:"args"`
	Env   []string `json:"env"`
	Stdin string   `json:"stdin"`
	Dir   string   `json:"dir"`
}

func runHelper(mode string) int {
	switch mode {
	case "report":
		stdin, _ := io.ReadAll(os.Stdin)
		dir, _ := os.Getwd()
		_ = json.NewEncoder(os.Stdout).Encode(helperReport{Args: os.Args, Env: os.Environ(), Stdin: string(stdin), Dir: dir})
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown helper mode %q\n", mode)
	return 2
}

type fixture struct {
	js      jetstream.JetStream
	events  *fleettest.Events
	handler map[string]*command.Handler
	env     *fleettest.Env
}

// setup starts a server and an agent running an exec handler per kind.
func setup(t *testing.T, agentCfg agent.Config, kinds map[string]command.Config) *fixture {
	t.Helper()
	srv := natstest.Server(t)
	env := fleettest.NewEnv(t, srv, topology.Config{})
	nc, js := natstest.JetStream(t, srv)
	f := &fixture{js: js, events: fleettest.WatchJobEvents(t, nc), handler: map[string]*command.Handler{}, env: env}
	if agentCfg.OutputTail == 0 {
		agentCfg.OutputTail = 64 << 10
	}
	agentCfg.StartedEventAfter = -1
	a, err := agent.New(env.Env.Conn, agentCfg, agent.WithEnv(env.Env))
	require.NoError(t, err)
	for kind, cfg := range kinds {
		h, err := command.New(cfg)
		require.NoError(t, err, kind)
		f.handler[kind] = h
		require.NoError(t, a.Register(kind, h.Run, agent.KindOptions{}))
	}
	require.NoError(t, a.Start(fleettest.Ctx(t, 10*time.Second)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, a.Stop(ctx))
		for _, h := range f.handler {
			h.Close()
		}
	})
	return f
}

func (f *fixture) publish(t *testing.T, job protocol.Job) {
	t.Helper()
	if job.Queue == "" {
		job.Queue = "default"
	}
	fleettest.Publish(t, f.js, job)
}

// alive reports whether pid is a live process (not gone, not a zombie).
func alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return fields[0] != "Z" && fields[0] != "X"
}

// groupAlive lists the live processes of process group pgid.
func groupAlive(pgid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(data)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 2 && fields[2] == strconv.Itoa(pgid) && fields[0] != "Z" && fields[0] != "X" {
			out = append(out, pid)
		}
	}
	return out
}

// pids reads "name pid" lines from output.
func pids(t *testing.T, output string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^(\w+) (\d+)$`).FindAllStringSubmatch(output, -1) {
		pid, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		out[m[1]] = pid
	}
	return out
}

func TestTimeoutKillsTheWholeProcessTree(t *testing.T) {
	t.Parallel()
	// A leader with two background children, one of which ignores SIGTERM
	// and needs the SIGKILL after kill_grace.
	f := setup(t, agent.Config{}, map[string]command.Config{"tree": {
		Command: "/bin/sh",
		Args: []string{"-c", `sleep 300 & echo child $!
(trap '' TERM; exec sleep 301) & echo stubborn $!
echo leader $$
wait`},
		KillGrace: 300 * time.Millisecond,
	}})
	f.publish(t, protocol.Job{ID: "tree-1", Kind: "tree", Timeout: time.Second, MaxAttempts: 1})
	ev := f.events.WaitFor(t, 30*time.Second, "tree-1", protocol.EventFailed)
	assert.Equal(t, protocol.CodeTimeout, ev.GetErrorCode())
	got := pids(t, ev.GetOutputTail())
	require.Len(t, got, 3, "output: %s", ev.GetOutputTail())
	for name, pid := range got {
		assert.False(t, alive(pid), "%s (pid %d) survived the timeout", name, pid)
	}
	assert.Empty(t, groupAlive(got["leader"]), "no process of the job's group survives")
	assert.Contains(t, ev.GetOutputTail(), "SIGTERM sent to the process group")
}

func TestProcessesLeftBehindAfterExitAreKilled(t *testing.T) {
	t.Parallel()
	f := setup(t, agent.Config{}, map[string]command.Config{"leaky": {
		Command: "/bin/sh", Args: []string{"-c", `sleep 300 & echo child $!; echo leader $$; exit 0`},
		KillGrace: 2 * time.Second,
	}})
	f.publish(t, protocol.Job{ID: "leaky-1", Kind: "leaky"})
	ev := f.events.WaitFor(t, 30*time.Second, "leaky-1", protocol.EventSucceeded)
	got := pids(t, ev.GetOutputTail())
	require.Contains(t, got, "child", "output: %s", ev.GetOutputTail())
	assert.False(t, alive(got["child"]), "the background child was killed")
	assert.Empty(t, groupAlive(got["leader"]))
	assert.Contains(t, ev.GetOutputTail(), "left 1 processes running")
}

func TestMemoryLimitIsEnforced(t *testing.T) {
	t.Parallel()
	// dd allocates a buffer of bs bytes: 64MiB does not fit in 32MiB of
	// address space and fits in 512MiB.
	dd := func(limit config.ByteSize) command.Config {
		return command.Config{Command: "/bin/dd", Args: []string{"if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"},
			Limits: command.Limits{Memory: limit}}
	}
	f := setup(t, agent.Config{}, map[string]command.Config{"small": dd(32 << 20), "roomy": dd(512 << 20)})
	f.publish(t, protocol.Job{ID: "small-1", Kind: "small", MaxAttempts: 1})
	f.publish(t, protocol.Job{ID: "roomy-1", Kind: "roomy", MaxAttempts: 1})
	failed := f.events.WaitFor(t, 30*time.Second, "small-1", protocol.EventFailed)
	assert.Contains(t, failed.GetOutputTail(), "memory exhausted")
	assert.Contains(t, failed.GetError(), "exit status 1")
	f.events.WaitFor(t, 30*time.Second, "roomy-1", protocol.EventSucceeded)
}

func TestCPUTimeLimitEndsTheProgram(t *testing.T) {
	t.Parallel()
	f := setup(t, agent.Config{}, map[string]command.Config{"spin": {
		Command: "/bin/sh", Args: []string{"-c", "while :; do :; done"}, Limits: command.Limits{CPUTime: time.Second},
	}})
	f.publish(t, protocol.Job{ID: "spin-1", Kind: "spin", MaxAttempts: 2, Backoff: []time.Duration{time.Hour}})
	ev := f.events.WaitFor(t, 60*time.Second, "spin-1", protocol.EventRetrying)
	assert.Contains(t, ev.GetError(), "killed by signal SIGXCPU")
	assert.Contains(t, ev.GetError(), "CPU time limit of 1s exceeded")
	assert.Equal(t, protocol.CodeHandlerError, ev.GetErrorCode(), "a limit is a retryable failure")
}

func TestOpenFilesLimitIsEnforced(t *testing.T) {
	t.Parallel()
	// paste opens all its files at once.
	args := slices.Repeat([]string{"/dev/null"}, 40)
	f := setup(t, agent.Config{}, map[string]command.Config{
		"few":  {Command: "/usr/bin/paste", Args: args, Limits: command.Limits{OpenFiles: 16}},
		"many": {Command: "/usr/bin/paste", Args: args, Limits: command.Limits{OpenFiles: 64}},
	})
	f.publish(t, protocol.Job{ID: "few-1", Kind: "few", MaxAttempts: 1})
	f.publish(t, protocol.Job{ID: "many-1", Kind: "many", MaxAttempts: 1})
	ev := f.events.WaitFor(t, 30*time.Second, "few-1", protocol.EventFailed)
	assert.Contains(t, ev.GetOutputTail(), "Too many open files")
	f.events.WaitFor(t, 30*time.Second, "many-1", protocol.EventSucceeded)
}

func TestEveryLimitIsSetOnTheProgram(t *testing.T) {
	t.Parallel()
	// RLIMIT_NPROC is not enforced for root, which the tests may run as:
	// what is checked here is that the program has it (and every other limit).
	f := setup(t, agent.Config{}, map[string]command.Config{"limits": {
		Command: "/bin/cat", Args: []string{"/proc/self/limits"},
		Limits: command.Limits{Memory: 256 << 20, CPUTime: 1500 * time.Millisecond, OpenFiles: 64, Processes: 50},
	}})
	f.publish(t, protocol.Job{ID: "limits-1", Kind: "limits"})
	out := f.events.WaitFor(t, 30*time.Second, "limits-1", protocol.EventSucceeded).GetOutputTail()
	for _, want := range []string{
		`Max address space\s+268435456\s+268435456\s+bytes`,
		`Max cpu time\s+2\s+3\s+seconds`, // rounded up; SIGKILL one second after SIGXCPU
		`Max open files\s+64\s+64\s+files`,
		`Max processes\s+50\s+50\s+processes`,
	} {
		assert.Regexp(t, want, out)
	}
}

func TestOutputIsTruncatedToItsTail(t *testing.T) {
	t.Parallel()
	f := setup(t, agent.Config{OutputTail: 1024}, map[string]command.Config{"chatty": {
		Command: "/bin/sh", Args: []string{"-c", "seq 1 100000; echo to-stderr >&2; exit 3"}, NonRetryableExitCodes: []int{3},
	}})
	f.publish(t, protocol.Job{ID: "chatty-1", Kind: "chatty"})
	dead := f.events.WaitFor(t, 30*time.Second, "chatty-1", protocol.EventDead)
	assert.Equal(t, protocol.ReasonNonRetryable, dead.GetReason())
	letters := fleettest.DeadLetters(t, f.js)
	require.Len(t, letters, 1)
	for _, out := range []string{dead.GetOutputTail(), letters[0].GetOutputTail()} {
		assert.Regexp(t, `^\[truncated: \d+ earlier bytes dropped\]\n`, out)
		assert.True(t, strings.HasSuffix(out, "99999\n100000\nto-stderr\n"), "the tail is kept: %q", out[max(len(out)-60, 0):])
		assert.NotContains(t, out, "\n1\n2\n3\n")
		assert.LessOrEqual(t, len(out), 1024+64)
	}
	assert.Equal(t, "exec: /bin/sh: exit status 3", letters[0].GetLastError())
}

// reportKind runs this test binary as the program, printing what it got.
func reportKind(t *testing.T) command.Config {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	return command.Config{
		Command:    self,
		Args:       []string{"--configured-arg", "second arg"},
		Env:        map[string]string{helperEnv: "report", "CONFIGURED": "yes"},
		InheritEnv: []string{"INHERITED_VAR", "NOT_SET_ANYWHERE"},
	}
}

func decodeReport(t *testing.T, ev *jetfleetpb.JobEvent) (helperReport, map[string]string) {
	t.Helper()
	var r helperReport
	require.NoError(t, json.Unmarshal([]byte(ev.GetOutputTail()), &r), "output: %s", ev.GetOutputTail())
	env := map[string]string{}
	for _, kv := range r.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return r, env
}

func TestPayloadCannotChangeTheCommand(t *testing.T) {
	t.Parallel()
	kind := reportKind(t)
	f := setup(t, agent.Config{}, map[string]command.Config{"report": kind})
	marker := filepath.Join(t.TempDir(), "pwned")
	payload := fmt.Sprintf(`{"command":"/bin/rm","args":["-rf","/"],"env":{"PATH":"/tmp"}}; touch %[1]s; $(touch %[1]s) `+
		"`touch %[1]s`"+` | touch %[1]s && touch %[1]s
--configured-arg=evil`, marker)
	jobID := "x;$(touch${IFS}" + marker + ")`id`"
	f.publish(t, protocol.Job{ID: jobID, Kind: "report", Payload: []byte(payload),
		Header: nats.Header{"Command": {"/bin/rm -rf /"}, "Args": {"--evil"}}})

	ev := f.events.WaitFor(t, 30*time.Second, jobID, protocol.EventSucceeded)
	r, env := decodeReport(t, ev)
	assert.Equal(t, []string{kind.Command, "--configured-arg", "second arg"}, r.Args, "argv is the configured one, exactly")
	assert.Equal(t, payload, r.Stdin, "the payload arrives on stdin, unchanged")
	assert.Equal(t, jobID, env[command.EnvJobID], "metadata is data, passed as it is")
	assert.NoFileExists(t, marker, "nothing of the job was run by a shell")
}

func TestEnvironmentHasJobMetadataAndNoAgentSecrets(t *testing.T) {
	t.Parallel()
	f := setup(t, agent.Config{}, map[string]command.Config{"report": reportKind(t)})
	ctx, span := f.env.Telemetry.TracerProvider.Tracer("publisher").Start(context.Background(), "publish")
	h := nats.Header{}
	telemetry.Inject(ctx, h)
	span.End()
	nominal := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	published := time.Now()
	f.publish(t, protocol.Job{ID: "env-1", Kind: "report", Timeout: time.Minute, MaxAttempts: 3, ScheduleID: "nightly",
		NominalTime: nominal, Header: h})

	ev := f.events.WaitFor(t, 30*time.Second, "env-1", protocol.EventSucceeded)
	r, env := decodeReport(t, ev)
	assert.Equal(t, "env-1", env[command.EnvJobID])
	assert.Equal(t, "report", env[command.EnvKind])
	assert.Equal(t, "default", env[command.EnvQueue])
	assert.Equal(t, "1", env[command.EnvAttempt])
	assert.Equal(t, "3", env[command.EnvMaxAttempts])
	key := protocol.IdempotencyKey("env-1", ev.GetStreamSequence())
	assert.Equal(t, key, env[command.EnvIdempotencyKey])
	assert.Equal(t, key+"#1", env[command.EnvAttemptKey])
	deadline, err := time.Parse(time.RFC3339, env[command.EnvDeadline])
	require.NoError(t, err, "deadline is RFC 3339")
	assert.WithinDuration(t, published.Add(time.Minute), deadline, 15*time.Second)
	assert.Equal(t, "nightly", env[command.EnvScheduleID])
	assert.Equal(t, "2030-01-02T03:04:05Z", env[command.EnvNominalTime])
	assert.Regexp(t, `^00-`+ev.GetTraceId()+`-[0-9a-f]{16}-0[01]$`, env[command.EnvTraceParent],
		"the program continues the job's trace")
	assert.Equal(t, "yes", env["CONFIGURED"])
	assert.Equal(t, "passed on", env["INHERITED_VAR"])
	assert.Equal(t, command.DefaultPath, env["PATH"])

	want := []string{"CONFIGURED", "INHERITED_VAR", "PATH", helperEnv, command.EnvAttempt, command.EnvDeadline, command.EnvJobID,
		command.EnvIdempotencyKey, command.EnvAttemptKey, command.EnvKind, command.EnvMaxAttempts, command.EnvNominalTime, command.EnvQueue, command.EnvScheduleID, command.EnvTraceParent, command.EnvResult}
	var keys []string
	for k := range env {
		keys = append(keys, k)
	}
	assert.ElementsMatch(t, want, keys, "the environment is exactly what the config allows plus the job's metadata")
	all := strings.Join(r.Env, "\n")
	assert.NotContains(t, all, agentSecret)
	assert.NotContains(t, all, agentNATSToken)
	assert.NotEqual(t, mustGetwd(t), r.Dir, "the program runs in its own directory")
	assert.NoDirExists(t, r.Dir, "the attempt's directory is removed")
}

func mustGetwd(t *testing.T) string {
	wd, err := os.Getwd()
	require.NoError(t, err)
	return wd
}

func TestExitCodesMapToOutcomes(t *testing.T) {
	t.Parallel()
	script := []string{"-c", `read code; [ "$code" = kill ] && kill -KILL $$; exit "$code"`}
	f := setup(t, agent.Config{}, map[string]command.Config{
		"lenient": {Command: "/bin/sh", Args: script, RetryableExitCodes: []int{75}, NonRetryableExitCodes: []int{64}},
		"strict": {Command: "/bin/sh", Args: script, RetryableExitCodes: []int{75}, NonRetryableExitCodes: []int{64},
			OtherExitCodes: command.ExitNonRetryable},
	})
	cases := []struct {
		kind, input, event, reason, error string
	}{
		{"lenient", "0", protocol.EventSucceeded, "", ""},
		{"lenient", "75", protocol.EventRetrying, "", "exit status 75"},
		{"lenient", "64", protocol.EventFailed, protocol.ReasonNonRetryable, "exit status 64"},
		{"lenient", "3", protocol.EventRetrying, "", "exit status 3"},
		{"lenient", "kill", protocol.EventRetrying, "", "killed by signal SIGKILL"},
		{"strict", "0", protocol.EventSucceeded, "", ""},
		{"strict", "75", protocol.EventRetrying, "", "exit status 75"},
		{"strict", "64", protocol.EventFailed, protocol.ReasonNonRetryable, "exit status 64"},
		{"strict", "3", protocol.EventFailed, protocol.ReasonNonRetryable, "exit status 3"},
		{"strict", "kill", protocol.EventRetrying, "", "killed by signal SIGKILL"},
	}
	for _, c := range cases {
		// A retry would come after an hour: each job shows its first outcome.
		f.publish(t, protocol.Job{ID: c.kind + "-" + c.input, Kind: c.kind, Payload: []byte(c.input + "\n"), MaxAttempts: 3,
			Backoff: []time.Duration{time.Hour}})
	}
	for _, c := range cases {
		id := c.kind + "-" + c.input
		ev := f.events.WaitFor(t, 30*time.Second, id, c.event)
		assert.Equal(t, c.reason, ev.GetReason(), id)
		assert.Contains(t, ev.GetError(), c.error, id)
	}
}

func TestCloseKillsRunningPrograms(t *testing.T) {
	t.Parallel()
	ready := filepath.Join(t.TempDir(), "ready")
	require.NoError(t, syscall.Mkfifo(ready, 0o600))
	f := setup(t, agent.Config{}, map[string]command.Config{"sleepy": {
		Command: "/bin/sh", Args: []string{"-c", `echo started > "$READY"; exec sleep 300`}, Env: map[string]string{"READY": ready},
	}})
	f.publish(t, protocol.Job{ID: "sleepy-1", Kind: "sleepy", MaxAttempts: 1})
	waitForLine(t, ready)
	f.handler["sleepy"].Close()
	ev := f.events.WaitFor(t, 30*time.Second, "sleepy-1", protocol.EventFailed)
	assert.Contains(t, ev.GetError(), "killed by signal SIGKILL")
}

// waitForLine reads the named pipe path until its writer closes it: the
// program wrote that it runs.
func waitForLine(t *testing.T, path string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		data, err := os.ReadFile(path) // blocks until the program opens the pipe
		if err == nil && len(data) == 0 {
			err = io.ErrUnexpectedEOF
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the program did not start")
	}
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	t.Parallel()
	err := command.Config{
		Command: "bin/tool", Dir: "work", Env: map[string]string{"JETFLEET_NATS_TOKEN": "x"}, InheritEnv: []string{"A=B"},
		KillGrace: -1, RetryableExitCodes: []int{0, 3}, NonRetryableExitCodes: []int{3}, OtherExitCodes: "maybe",
		Limits: command.Limits{Memory: 1000, CPUTime: -1, OpenFiles: 2, Processes: -1},
	}.Validate("handlers.x")
	require.Error(t, err)
	for _, key := range []string{"command", "dir", "env", "inherit_env", "kill_grace", "retryable_exit_codes",
		"non_retryable_exit_codes", "other_exit_codes", "limits.memory", "limits.cpu_time", "limits.open_files", "limits.processes"} {
		assert.ErrorContains(t, err, "config key handlers.x."+key+":")
	}
	assert.ErrorContains(t, command.Config{}.Validate("h"), "config key h.command: is required")

	_, err = command.New(command.Config{Command: "/nonexistent/tool"})
	assert.ErrorContains(t, err, "/nonexistent/tool")
	plain := filepath.Join(t.TempDir(), "not-a-program")
	require.NoError(t, os.WriteFile(plain, []byte("data"), 0o644))
	_, err = command.New(command.Config{Command: plain})
	assert.ErrorContains(t, err, "not an executable file")
}

// TestProgramReportsProgress: a program reports progress with
// "::progress <fraction> <message>" lines on stdout or stderr; they become
// progress events, not output. A line that does not read stays in the
// output.
func TestProgramReportsProgress(t *testing.T) {
	t.Parallel()
	// The program's work takes time: the agent publishes at most one
	// progress event a second, so its reports are more than a second apart.
	f := setup(t, agent.Config{}, map[string]command.Config{"resize": {
		Command: "/bin/sh", Args: []string{"-c", `echo "::progress 0.25 image 1 of 4"; sleep 1.2
printf '::progress 0.75 image 3 of 4\n' >&2; sleep 1.2
echo "::progress lots"; echo done`},
	}})
	f.publish(t, protocol.Job{ID: "resize-1", Kind: "resize"})
	ok := f.events.WaitFor(t, 30*time.Second, "resize-1", protocol.EventSucceeded)
	var progress []*jetfleetpb.JobEvent
	for _, ev := range f.events.All() {
		if ev.GetType() == protocol.EventProgress {
			progress = append(progress, ev)
		}
	}
	require.Len(t, progress, 2, "events: %v", f.events.Of("resize-1"))
	assert.Equal(t, 0.25, progress[0].GetProgress())
	assert.Equal(t, "image 1 of 4", progress[0].GetProgressMessage())
	assert.Equal(t, 0.75, progress[1].GetProgress())
	assert.Equal(t, "image 3 of 4", progress[1].GetProgressMessage(), "a line on stderr reports too")
	assert.Equal(t, "::progress lots\ndone\n", ok.GetOutputTail(), "progress lines are not output; a bad one is")
}

// TestProgramWritesItsResult: a program writes its result, a JSON
// document, to the file $JETFLEET_RESULT names; it is stored with the
// succeeded event. A result that is not JSON, or larger than the agent's
// max_result, fails the job for good.
func TestProgramWritesItsResult(t *testing.T) {
	t.Parallel()
	f := setup(t, agent.Config{MaxResult: 1024}, map[string]command.Config{
		"export": {Command: "/bin/sh", Args: []string{"-c", `printf '{"files": [\n "a.csv", "b.csv"]}\n' > "$JETFLEET_RESULT"`}},
		"broken": {Command: "/bin/sh", Args: []string{"-c", `echo 'rows=42' > "$JETFLEET_RESULT"`}},
		"silent": {Command: "/bin/true"},
		// 2,000 bytes of JSON against the agent's max_result of 1 KiB.
		"huge": {Command: "/bin/sh", Args: []string{"-c", `printf '"%02000d"' 0 > "$JETFLEET_RESULT"`}},
	})
	f.publish(t, protocol.Job{ID: "export-1", Kind: "export"})
	f.publish(t, protocol.Job{ID: "broken-1", Kind: "broken"})
	f.publish(t, protocol.Job{ID: "silent-1", Kind: "silent"})
	f.publish(t, protocol.Job{ID: "huge-1", Kind: "huge"})
	ok := f.events.WaitFor(t, 30*time.Second, "export-1", protocol.EventSucceeded)
	assert.Equal(t, `{"files":["a.csv","b.csv"]}`, string(ok.GetResult()), "stored as compact JSON")
	dead := f.events.WaitFor(t, 30*time.Second, "broken-1", protocol.EventDead)
	assert.Contains(t, dead.GetError(), "$JETFLEET_RESULT")
	assert.Contains(t, dead.GetError(), "not a JSON document")
	assert.Equal(t, uint32(1), dead.GetAttempt(), "not retried: the program would write it again")
	silent := f.events.WaitFor(t, 30*time.Second, "silent-1", protocol.EventSucceeded)
	assert.Empty(t, silent.GetResult(), "no file, no result")
	huge := f.events.WaitFor(t, 30*time.Second, "huge-1", protocol.EventDead)
	assert.Contains(t, huge.GetError(), "result too large: 2002 bytes of JSON, agent.max_result is 1KiB")
	assert.Equal(t, uint32(1), huge.GetAttempt(), "not retried: the program would write it again")
	assert.Empty(t, huge.GetResult())
}
