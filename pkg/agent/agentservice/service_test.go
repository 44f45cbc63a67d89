package agentservice_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent/agentservice"
	"github.com/jetfleet/jetfleet/pkg/agent/command"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

func TestMain(m *testing.M) {
	command.RunLauncherIfRequested()
	natstest.VerifyNoLeaks(m)
}

func TestServiceRunsConfiguredHandlers(t *testing.T) {
	t.Parallel()
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_, _ = fmt.Fprintf(w, "got %s for %s", body, r.Header.Get("Jetfleet-Job-Id"))
	}))
	t.Cleanup(web.Close)
	ready := filepath.Join(t.TempDir(), "ready")
	require.NoError(t, syscall.Mkfifo(ready, 0o600))
	cfg, err := load(t, writeYAML(t, fmt.Sprintf(`
agent:
  started_event_after: -1s
handlers:
  echo-exec:
    type: exec
    command: /bin/cat
    limits: {memory: 256MiB, open_files: 64}
  notify:
    type: http
    url: %s/hook
  failing:
    type: exec
    command: /bin/sh
    args: [-c, "echo nope; exit 3"]
    max_attempts: 2
    backoff: {initial_delay: 100ms, jitter: -1}
  stubborn:
    type: exec
    command: /bin/sh
    args: [-c, "trap '' TERM; echo $$ > \"$READY\"; while :; do sleep 1; done"]
    env: {READY: %s}
    kill_grace: 1m
  echo:
    type: demo
  greet:
    type: demo
    demo: echo
`, web.URL, ready)))
	require.NoError(t, err)

	srv := natstest.Server(t)
	env := fleettest.NewEnv(t, srv, topology.Config{})
	nc, js := natstest.JetStream(t, srv)
	events := fleettest.WatchJobEvents(t, nc)
	component, err := agentservice.BuildFunc(cfg)(context.Background(), env.Env, nil)
	require.NoError(t, err)
	s := component.(*agentservice.Service)
	assert.ErrorContains(t, s.Ready(context.Background()), "not started")
	require.NoError(t, s.Start(fleettest.Ctx(t, 10*time.Second)))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = s.Stop(context.Background())
		}
	})
	assert.NoError(t, s.Ready(context.Background()))
	assert.Equal(t, []string{"echo", "echo-exec", "failing", "greet", "notify", "stubborn"}, s.Agent().Kinds())

	fleettest.Publish(t, js, protocol.Job{ID: "e-1", Queue: "default", Kind: "echo-exec", Payload: []byte(`{"hello":"exec"}`)})
	fleettest.Publish(t, js, protocol.Job{ID: "n-1", Queue: "default", Kind: "notify", Payload: []byte(`{"hello":"http"}`)})
	fleettest.Publish(t, js, protocol.Job{ID: "f-1", Queue: "default", Kind: "failing"})
	assert.Equal(t, `{"hello":"exec"}`, events.WaitFor(t, 30*time.Second, "e-1", protocol.EventSucceeded).GetOutputTail())
	fleettest.Publish(t, js, protocol.Job{ID: "d-1", Queue: "default", Kind: "greet", Payload: []byte(`{"hello":"demo"}`)})
	assert.Equal(t, `{"hello":"demo"}`, events.WaitFor(t, 30*time.Second, "d-1", protocol.EventSucceeded).GetOutputTail(), "a demo handler runs the demo it names")
	assert.Equal(t, `HTTP 200 OK`+"\n"+`got {"hello":"http"} for n-1`, events.WaitFor(t, 30*time.Second, "n-1", protocol.EventSucceeded).GetOutputTail())

	// The kind's max_attempts and backoff apply.
	retrying := events.WaitFor(t, 30*time.Second, "f-1", protocol.EventRetrying)
	assert.Equal(t, 100*time.Millisecond, retrying.GetRetryIn().AsDuration())
	dead := events.WaitFor(t, 30*time.Second, "f-1", protocol.EventDead)
	assert.Equal(t, protocol.ReasonMaxAttempts, dead.GetReason())
	assert.Equal(t, uint32(2), dead.GetAttempt())
	assert.Equal(t, "nope\n", dead.GetOutputTail())

	// A program that ignores SIGTERM for longer than the shutdown allows
	// does not outlive the service.
	fleettest.Publish(t, js, protocol.Job{ID: "s-1", Queue: "default", Kind: "stubborn"})
	pid, err := strconv.Atoi(strings.TrimSpace(readPipe(t, ready)))
	require.NoError(t, err)
	require.True(t, alive(pid))
	// A 10 s grace leaves the program's SIGKILL (half a second after the
	// hand-back begins) a second to settle, however loaded the machine.
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stopped = true
	require.NoError(t, s.Stop(stopCtx))
	assert.False(t, alive(pid), "the stubborn program was killed when the service stopped")
	released := events.WaitFor(t, 10*time.Second, "s-1", protocol.EventReleased)
	assert.Equal(t, uint32(1), released.GetSnoozes(), "handed back in time: the next delivery does not count an attempt")
	assert.ErrorContains(t, s.Ready(context.Background()), "stopping")
}

// readPipe reads the named pipe path until its writer closes it.
func readPipe(t *testing.T, path string) string {
	t.Helper()
	type result struct {
		data []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		data, err := os.ReadFile(path) // blocks until the program opens the pipe
		done <- result{data, err}
	}()
	select {
	case r := <-done:
		require.NoError(t, r.err)
		return string(r.data)
	case <-time.After(30 * time.Second):
		t.Fatal("the program did not start")
		return ""
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

func TestBuildNamesTheHandlerThatCannotRun(t *testing.T) {
	t.Parallel()
	cfg, err := load(t, writeYAML(t, "handlers:\n  ok: {type: exec, command: /bin/cat}\n  gone: {type: exec, command: /nonexistent/tool}\n"))
	require.NoError(t, err, "the configuration itself is valid")
	_, err = agentservice.BuildFunc(cfg)(context.Background(), &service.Env{Logger: fleettest.Logger(t)}, nil)
	assert.ErrorContains(t, err, "handlers.gone: command /nonexistent/tool")
}
