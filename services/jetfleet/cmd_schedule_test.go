package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/bench"
	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

func TestMain(m *testing.M) {
	bench.RunChildServerIfAsked() // the bench's delayed scenario runs its server so
	if os.Getenv("JETFLEET_TEST_MAIN") == "1" {
		// The child process of runMain: jetfleet's main, with the
		// arguments after "--".
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"jetfleet"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		os.Exit(0)
	}
	natstest.VerifyNoLeaks(m)
}

// TestScheduleCommand drives every schedule subcommand against a real
// server and scheduler replica.
func TestScheduleCommand(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	nc, js := natstest.JetStream(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, topology.Ensure(ctx, js, topology.Config{}))
	env := &service.Env{Name: "scheduler", Base: &service.Base{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Conn: nc, JetStream: js}
	s, err := scheduler.New(scheduler.Config{}, env, clock.Real())
	require.NoError(t, err)
	require.NoError(t, s.Start(ctx))
	t.Cleanup(func() { _ = s.Stop(context.Background()) })

	cli := func(args ...string) (string, error) {
		var out bytes.Buffer
		full := append([]string{"schedule", args[0], "-server", srv.ClientURL()}, args[1:]...)
		err := run(ctx, full, &out)
		return out.String(), err
	}
	out, err := cli("add", "-cron", "0 7 * * 1-5", "-zone", "Europe/Berlin", "-kind", "report", "-payload", `{"a":1}`,
		"-overlap", "skip", "-job-timeout", "5m", "nightly")
	require.NoError(t, err)
	assert.Contains(t, out, "schedule nightly stored")
	assert.Contains(t, out, "next: ")

	_, err = cli("add", "-cron", "61 * * * *", "-kind", "report", "broken")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "spec.cron")

	_, err = cli("add", "-every", "1h", "-kind", "report", "nightly")
	require.Error(t, err)
	assert.Equal(t, `already_exists: id: schedule "nightly" exists: pass -replace to update it`, err.Error(), "names the flag the CLI has")

	bad := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"id": "bad", "spec": [`), 0o600))
	_, err = cli("add", "-f", bad)
	require.Error(t, err)
	assert.Equal(t, "-f: "+bad+": invalid JSON: line 1, column 24: unexpected end of the document", err.Error())

	out, err = cli("add", "-replace", "-every", "1h", "-kind", "report", "nightly")
	require.NoError(t, err)
	assert.Contains(t, out, "stored (revision 2)")

	// With a supervisor to list the queues: a target queue that does not
	// exist is stored, with a note.
	startSupervisor(ctx, t, srv)
	out, err = cli("add", "-every", "1h", "-queue", "nosuchqueue", "-kind", "report", "elsewhere")
	require.NoError(t, err)
	assert.Contains(t, out, "schedule elsewhere stored")
	assert.Contains(t, out, "\nnote: no queue nosuchqueue exists yet; its jobs are dead-lettered as unroutable until an agent serves it")
	_, err = cli("rm", "elsewhere")
	require.NoError(t, err)

	out, err = cli("ls")
	require.NoError(t, err)
	assert.Contains(t, out, "nightly")
	assert.Contains(t, out, "every 3600s")
	out, err = cli("ls", "-all", "-limit", "1", "-o", "json")
	require.NoError(t, err)
	var list jetfleet.ScheduleListResponse
	require.NoError(t, json.Unmarshal([]byte(out), &list), "-all -o json prints one document: %s", out)
	require.Len(t, list.Schedules, 1)
	assert.Equal(t, "nightly", list.Schedules[0].ID)

	out, err = cli("preview", "-cron", "30 2 * * *", "-zone", "America/New_York", "-from", "2026-03-07T12:00:00Z", "-count", "2")
	require.NoError(t, err)
	assert.Equal(t, "2026-03-08T03:30:00-04:00\n2026-03-09T02:30:00-04:00\n", out, "the spring-forward gap fires once, shifted")

	out, err = cli("pause", "-note", "maintenance", "nightly")
	require.NoError(t, err)
	assert.Contains(t, out, "paused")
	out, err = cli("get", "nightly")
	require.NoError(t, err)
	assert.Regexp(t, `STATE\s+paused: maintenance`, out)
	assert.Regexp(t, `TRIGGER\s+every 1h0m0s`, out)
	out, err = cli("get", "nightly", "-o", "json")
	require.NoError(t, err)
	assert.Contains(t, out, `"note": "maintenance"`)
	assert.Contains(t, out, `"every": "3600s"`)
	_, err = cli("resume", "nightly")
	require.NoError(t, err)

	out, err = cli("trigger", "nightly")
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(out, "fired job sched.nightly.manual."), out)

	from := time.Now().Add(-3 * time.Hour).UTC().Format(time.RFC3339)
	to := time.Now().UTC().Format(time.RFC3339)
	out, err = cli("backfill", "-from", from, "-to", to, "nightly")
	require.NoError(t, err)
	assert.Contains(t, out, "fired 3 ")

	out, err = cli("rm", "nightly")
	require.NoError(t, err)
	assert.Contains(t, out, "removed")
	_, err = cli("get", "nightly")
	require.ErrorIs(t, err, protocol.Code(protocol.CodeNotFound))
	_, err = cli("rm", "nightly")
	require.ErrorIs(t, err, protocol.Code(protocol.CodeNotFound), "removing a missing schedule is refused")
	assert.Equal(t, 1, exitCode(err))

	// A trigger the overlap policy skips is refused: no agent runs the first fire.
	_, err = cli("add", "-every", "1h", "-kind", "report", "-overlap", "skip", "solo")
	require.NoError(t, err)
	out, err = cli("trigger", "solo")
	require.NoError(t, err)
	assert.Contains(t, out, "fired job sched.solo.manual.")
	out, err = cli("trigger", "solo")
	require.ErrorIs(t, err, errRefused)
	assert.Equal(t, 1, exitCode(err))
	assert.ErrorContains(t, err, "schedule solo: the trigger was skipped (overlap)")
	assert.Contains(t, out, "skipped: overlap")

	jobs, err := js.Stream(ctx, "JOBS")
	require.NoError(t, err)
	info, err := jobs.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(5), info.State.Msgs, "two triggers and three backfilled hours")
}
