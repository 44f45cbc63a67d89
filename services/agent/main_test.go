package main

// Process-level tests: the real agent binary, built once, runs as
// subprocesses against an embedded JetStream server and is killed or
// stopped mid-job like in production.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// agentBin is the agent binary built by TestMain.
var agentBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "jetfleet-agent-test-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "agent tests: temp dir: %v\n", err)
		os.Exit(1)
	}
	agentBin = filepath.Join(dir, "agent")
	build := exec.Command("go", "build", "-o", agentBin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "agent tests: cannot build the agent binary (go build -o %s .): %v\n%s", agentBin, err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		if err := natstest.FindLeaks(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// agentProc is one agent process.
type agentProc struct {
	id     string
	cmd    *exec.Cmd
	output *lockedBuffer
	exited chan struct{}
	err    error // of Wait, once exited is closed
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startAgent runs the agent binary with the given id and handlers section
// (YAML, indented by two spaces) and waits for its first heartbeat.
func startAgent(t *testing.T, srv *server.Server, nc *nats.Conn, ackWait time.Duration, id, handlers string) *agentProc {
	t.Helper()
	cfgPath := filepath.Join(t.TempDir(), id+".yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf(`nats:
  url: %s
topology:
  queues:
    default: {ack_wait: %s}
telemetry:
  http_addr: ""
  log_level: debug
shutdown_grace: 10s
agent:
  id: %s
  heartbeat_interval: 200ms
  started_event_after: -1s
  fetch_max_wait: 250ms
handlers:
%s`, srv.ClientURL(), ackWait, id, handlers)), 0o600))

	beat := make(chan struct{}, 1)
	sub, err := nc.Subscribe(protocol.HeartbeatSubject(id), func(*nats.Msg) {
		select {
		case beat <- struct{}{}:
		default:
		}
	})
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, nc.Flush())

	p := &agentProc{id: id, output: &lockedBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(agentBin, "-config", cfgPath)
	// Nothing of this process's environment: the config file says it all.
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	p.cmd.Stdout, p.cmd.Stderr = p.output, p.output
	require.NoError(t, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("agent %s output:\n%s", id, p.output.String())
		}
	})
	select {
	case <-beat:
	case <-p.exited:
		t.Fatalf("agent %s exited: %v\n%s", id, p.err, p.output.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("agent %s sent no heartbeat\n%s", id, p.output.String())
	}
	return p
}

// wait waits for the process to exit and returns how it ended.
func (p *agentProc) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case <-p.exited:
		return p.err
	case <-time.After(timeout):
		t.Fatalf("agent %s did not exit within %s\n%s", p.id, timeout, p.output.String())
		return nil
	}
}

// pidPipe is a named pipe the jobs' programs write their pid to.
type pidPipe struct {
	path  string
	lines chan int
}

func newPidPipe(t *testing.T) *pidPipe {
	t.Helper()
	p := &pidPipe{path: filepath.Join(t.TempDir(), "pids"), lines: make(chan int, 100)}
	require.NoError(t, syscall.Mkfifo(p.path, 0o600))
	// Opened read-write, the pipe never reports end-of-file when a writer
	// closes it: every program's line arrives.
	f, err := os.OpenFile(p.path, os.O_RDWR, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	go func() {
		s := bufio.NewScanner(f)
		for s.Scan() {
			if pid, err := strconv.Atoi(strings.TrimSpace(s.Text())); err == nil {
				p.lines <- pid
			}
		}
		close(p.lines)
	}()
	return p
}

func (p *pidPipe) next(t *testing.T) int {
	t.Helper()
	select {
	case pid := <-p.lines:
		return pid
	case <-time.After(30 * time.Second):
		t.Fatal("no program started")
		return 0
	}
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

func setupServer(t *testing.T, ackWait time.Duration) (*server.Server, *nats.Conn, *fleettest.Events, *fleettest.Env) {
	t.Helper()
	srv := natstest.Server(t)
	env := fleettest.NewEnv(t, srv, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: ackWait}}})
	nc := natstest.Connect(t, srv)
	return srv, nc, fleettest.WatchJobEvents(t, nc), env
}

// holdJobs is a handlers section whose kind "work" runs until killed and
// ignores SIGTERM; each program writes its pid to pids first.
func holdJobs(pids string) string {
	return fmt.Sprintf(`  work:
    type: exec
    command: /bin/sh
    args: [-c, "trap '' TERM; echo $$ > \"$PIDS\"; while :; do sleep 1; done"]
    env: {PIDS: %s}
    kill_grace: 1m
`, pids)
}

// finishJobs is a handlers section whose kind "work" succeeds at once.
const finishJobs = `  work:
    type: exec
    command: /bin/cat
`

func TestSIGKILLedAgentsJobsCompleteElsewhereAfterAckWait(t *testing.T) {
	t.Parallel()
	const ackWait = 2 * time.Second
	srv, nc, events, env := setupServer(t, ackWait)
	pids := newPidPipe(t)
	first := startAgent(t, srv, nc, ackWait, "doomed", holdJobs(pids.path))

	jobs := []string{"k-0", "k-1", "k-2"}
	for _, id := range jobs {
		fleettest.Publish(t, env.JetStream, protocol.Job{ID: id, Queue: "default", Kind: "work"})
	}
	var programs []int
	for range jobs {
		programs = append(programs, pids.next(t))
	}
	// The started events go out asynchronously: wait for them before the
	// kill, or a killed agent may take them along.
	started := map[string]*jetfleetpb.JobEvent{}
	for _, id := range jobs {
		started[id] = events.WaitFor(t, 30*time.Second, id, protocol.EventStarted)
		require.Equal(t, "doomed", started[id].GetAgentId())
	}
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	assert.ErrorContains(t, first.wait(t, 10*time.Second), "signal: killed")
	for _, pid := range programs {
		// Pdeathsig: the kernel kills each program once its agent is gone.
		assert.Eventually(t, func() bool { return !alive(pid) }, 10*time.Second, 10*time.Millisecond,
			"program %d outlived its SIGKILLed agent", pid)
	}
	// Queued behind the dead agent: must not be lost either.
	fleettest.Publish(t, env.JetStream, protocol.Job{ID: "k-3", Queue: "default", Kind: "work"})

	startAgent(t, srv, nc, ackWait, "rescuer", finishJobs)
	for _, id := range jobs {
		ev := events.WaitFor(t, 30*time.Second, id, protocol.EventSucceeded)
		assert.Equal(t, "rescuer", ev.GetAgentId(), id)
		assert.Equal(t, uint64(2), ev.GetDelivered(), "%s: redelivered once", id)
		// Started soon after the first delivery (a second of slack for a
		// loaded machine); redelivered AckWait after it, not at once.
		assert.GreaterOrEqual(t, ev.GetTime().AsTime().Sub(started[id].GetTime().AsTime()), ackWait-time.Second,
			"%s: JetStream redelivered it after AckWait", id)
	}
	assert.Equal(t, "rescuer", events.WaitFor(t, 30*time.Second, "k-3", protocol.EventSucceeded).GetAgentId())
	t.Logf("jobs of the killed agent completed %s after the kill (AckWait %s)", time.Since(killed).Round(time.Millisecond), ackWait)
	// The succeeded event is published before the ack: wait for the acks.
	fleettest.WaitStreamMsgs(t, env.JetStream, protocol.StreamJobs, 0, 10*time.Second)
	assert.Empty(t, fleettest.DeadLetters(t, env.JetStream), "nothing dead-lettered")
}

func TestSIGTERMedAgentHandsJobsBackAtOnce(t *testing.T) {
	t.Parallel()
	// AckWait is long: a job not handed back would wait a minute.
	const ackWait = time.Minute
	srv, nc, events, env := setupServer(t, ackWait)
	pids := newPidPipe(t)
	first := startAgent(t, srv, nc, ackWait, "leaving", holdJobs(pids.path))
	fleettest.Publish(t, env.JetStream, protocol.Job{ID: "t-0", Queue: "default", Kind: "work"})
	program := pids.next(t)

	startAgent(t, srv, nc, ackWait, "staying", finishJobs)
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGTERM))
	stopped := time.Now()
	// The program ignores SIGTERM and never ends: it outlives the 10s
	// shutdown grace; the agent kills it, hands the job back and exits cleanly.
	// (The grace leaves the kill a second to settle, however loaded the machine.)
	require.NoError(t, first.wait(t, 30*time.Second), "the agent exits 0 after a graceful stop")
	assert.False(t, alive(program), "the program does not outlive its agent")

	released := events.WaitFor(t, 10*time.Second, "t-0", protocol.EventReleased)
	assert.Equal(t, "leaving", released.GetAgentId())
	ev := events.WaitFor(t, 30*time.Second, "t-0", protocol.EventSucceeded)
	took := time.Since(stopped)
	handOver := ev.GetTime().AsTime().Sub(released.GetTime().AsTime())
	assert.Less(t, handOver, 5*time.Second, "done on the other agent right after the hand-back, not after AckWait (%s)", ackWait)
	t.Logf("hand-back to completion elsewhere: %s", handOver.Round(time.Millisecond))
	assert.Equal(t, "staying", ev.GetAgentId())
	assert.Equal(t, uint32(1), ev.GetAttempt(), "a hand-back spends no attempt")
	assert.Less(t, took, 20*time.Second, "redelivered at once (shutdown grace 10s), not after AckWait (%s)", ackWait)
	t.Logf("job completed on the other agent %s after SIGTERM (shutdown grace 10s, AckWait %s)", took.Round(time.Millisecond), ackWait)
	fleettest.WaitStreamMsgs(t, env.JetStream, protocol.StreamJobs, 0, 10*time.Second) // acked after its event
	var types []string
	for _, e := range events.All() {
		if e.GetJobId() == "t-0" {
			types = append(types, e.GetType()+"@"+e.GetAgentId())
		}
	}
	assert.Equal(t, []string{"started@leaving", "released@leaving", "started@staying", "succeeded@staying"}, types)
}

// cancellableJobs is a handlers section whose kind "work" runs until it is
// signalled; each program writes its pid to pids first.
func cancellableJobs(pids string) string {
	return fmt.Sprintf(`  work:
    type: exec
    command: /bin/sh
    args: [-c, "echo $$ > \"$PIDS\"; exec sleep 600"]
    env: {PIDS: %s}
    kill_grace: 5s
`, pids)
}

// TestRunningJobOnAnAgentProcessIsCancelledByID is issue 20's cancel of a
// running job held by an agent in another process: the client asks the
// supervisor by job id only; the supervisor finds the agent from its
// heartbeats and sends the command; the agent stops the job's program and
// records cancelled — no dead letter, the job gone from JOBS.
func TestRunningJobOnAnAgentProcessIsCancelledByID(t *testing.T) {
	t.Parallel()
	const ackWait = time.Minute
	srv, nc, events, env := setupServer(t, ackWait)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sup, err := supervisor.New(supervisor.Config{CheckInterval: 50 * time.Millisecond}, fleettest.NewEnv(t, srv, env.Base.Topology).Env, clock.Real())
	require.NoError(t, err)
	require.NoError(t, sup.Start(ctx))
	t.Cleanup(func() { _ = sup.Stop(context.Background()) })
	pids := newPidPipe(t)
	startAgent(t, srv, nc, ackWait, "far-away", cancellableJobs(pids.path))

	fleettest.Publish(t, env.JetStream, protocol.Job{ID: "c-0", Queue: "default", Kind: "work"})
	program := pids.next(t)
	events.WaitFor(t, 30*time.Second, "c-0", protocol.EventStarted)
	// The supervisor knows where a job runs from the agents' heartbeats:
	// wait until one lists it, as the cancel of a running job needs.
	client := jetfleet.NewClient(nc)
	require.Eventually(t, func() bool {
		running, err := client.RunningJobs(ctx, jetfleet.RunningJobsRequest{AgentID: "far-away"})
		return err == nil && len(running.Jobs) == 1 && running.Jobs[0].JobID == "c-0"
	}, 10*time.Second, 20*time.Millisecond, "the supervisor sees the job running on far-away")
	res, err := client.Cancel(ctx, "c-0", jetfleet.CancelReason("the order was withdrawn"))
	require.NoError(t, err)
	assert.Equal(t, "far-away", res.AgentID, "cancelled where it runs: %+v", *res)

	ev := events.WaitFor(t, 30*time.Second, "c-0", protocol.EventCancelled)
	assert.Equal(t, "far-away", ev.GetAgentId())
	assert.Contains(t, ev.GetError(), "the order was withdrawn")
	assert.Eventually(t, func() bool { return !alive(program) }, 10*time.Second, 10*time.Millisecond, "the job's program outlived its cancel")
	fleettest.WaitStreamMsgs(t, env.JetStream, protocol.StreamJobs, 0, 10*time.Second)
	assert.Empty(t, fleettest.DeadLetters(t, env.JetStream), "a cancel is not a dead letter")
	for _, e := range events.All() {
		assert.NotContains(t, []string{protocol.EventFailed, protocol.EventDead}, e.GetType(), "job %s", e.GetJobId())
	}
}
