package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/bench"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natsconn"
)

// everyCommand lists the path of every command and subcommand, groups included.
func everyCommand() [][]string {
	var paths [][]string
	var walk func(c *command, path []string)
	walk = func(c *command, path []string) {
		for _, s := range c.subs {
			p := append(append([]string(nil), path...), s.name)
			paths = append(paths, p)
			walk(s, p)
		}
	}
	walk(root, nil)
	return paths
}

func TestHelpExitsZeroEverywhere(t *testing.T) {
	t.Parallel()
	paths := append(everyCommand(), []string{})
	require.Greater(t, len(paths), 25, "the registry holds every command")
	for _, path := range paths {
		title := strings.TrimSpace("jetfleet " + strings.Join(path, " "))
		for _, help := range []string{"-h", "--help", "-help"} {
			t.Run(title+" "+help, func(t *testing.T) {
				t.Parallel()
				var out bytes.Buffer
				err := run(context.Background(), append(append([]string(nil), path...), help), &out)
				require.NoError(t, err)
				assert.Equal(t, 0, exitCode(err))
				assert.True(t, strings.HasPrefix(out.String(), "usage: "+title+" "), "%s", out.String())
			})
		}
		t.Run("jetfleet help "+strings.Join(path, " "), func(t *testing.T) {
			t.Parallel()
			var viaHelp, viaFlag bytes.Buffer
			require.NoError(t, run(context.Background(), append([]string{"help"}, path...), &viaHelp))
			require.NoError(t, run(context.Background(), append(append([]string(nil), path...), "-h"), &viaFlag))
			assert.Equal(t, viaFlag.String(), viaHelp.String())
		})
	}
}

func TestHelpShowsConnectionFlagsAndFormats(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"dlq", "ls", "-h"}, &out))
	for _, want := range []string{"-password", "$NATS_PASSWORD", "-user", "$NATS_USER", "-token", "$NATS_TOKEN", "-creds",
		"$NATS_CREDS", "-nkey", "$NATS_NKEY", "-server", "$NATS_URL", "-o format", `"1.5s"`} {
		assert.Contains(t, out.String(), want)
	}
	out.Reset()
	require.NoError(t, run(context.Background(), []string{"help"}, &out))
	assert.Contains(t, out.String(), `every duration is a string of seconds with an
"s" suffix ("1.5s", "30s")`, "the JSON duration format is documented")
	assert.Contains(t, out.String(), "Exit status: 0 done; 1 failed or refused")
}

func TestUsageErrorsNameTheMissingPiece(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "no command given"},
		{[]string{"nosuch"}, `unknown command "nosuch"`},
		{[]string{"dlq"}, "dlq needs a subcommand: ls, show, replay or purge"},
		{[]string{"dlq", "nosuch"}, `unknown dlq command "nosuch": want ls, show, replay or purge`},
		{[]string{"help", "dlq", "nosuch"}, `unknown dlq command "nosuch"`},
		{[]string{"dlq", "ls", "-nosuch"}, "dlq ls: flag provided but not defined: -nosuch"},
		{[]string{"status", "-timeout", "soon"}, `status: invalid value "soon" for flag -timeout`},
		{[]string{"status", "-o", "yaml"}, `status: -o "yaml": want table or json`},
		{[]string{"status", "extra"}, `status takes no arguments, got ["extra"]`},
		{[]string{"schedule", "add"}, "schedule add needs the schedule <id>"},
		{[]string{"schedule", "add", "-f", "x.json", "nightly"}, "schedule add takes the schedule <id> or -f, not both"},
		{[]string{"schedule", "get"}, "schedule get needs the schedule <id>"},
		{[]string{"schedule", "get", "a", "b"}, `schedule get takes the schedule <id>, got 1 more: ["b"]`},
		{[]string{"schedule", "add", "-every", "soon", "nightly"}, `schedule add: -every "soon" is not a duration such as 30s or 1h`},
		{[]string{"schedule", "add", "-kind", "k", "-payload", "{", "-every", "1h", "nightly"}, "schedule add: -payload is not JSON"},
		{[]string{"dlq", "ls", "-since", "yesterday"}, `dlq ls: -since "yesterday" is neither an RFC 3339 time nor a duration`},
		{[]string{"submit", "-backoff", "x", "default", "echo"}, `submit: -backoff "x"`},
		{[]string{"schedule", "rm"}, "schedule rm needs the schedule <id>"},
		{[]string{"schedule", "pause"}, "schedule pause needs the schedule <id>"},
		{[]string{"schedule", "resume"}, "schedule resume needs the schedule <id>"},
		{[]string{"schedule", "trigger"}, "schedule trigger needs the schedule <id>"},
		{[]string{"schedule", "preview"}, "schedule preview needs the schedule <id> (or a definition"},
		{[]string{"schedule", "backfill"}, "schedule backfill needs the schedule <id>"},
		{[]string{"schedule", "backfill", "nightly"}, "schedule backfill needs -from and -to"},
		{[]string{"dlq", "show"}, "dlq show needs the dead letter <sequence>"},
		{[]string{"dlq", "show", "x"}, `dlq show: "x" is not a dead letter sequence`},
		{[]string{"dlq", "replay"}, "dlq replay needs the dead letter <sequence>, a filter flag or -all"},
		{[]string{"dlq", "purge"}, "dlq purge needs the dead letter <sequence>, a filter flag or -all"},
		{[]string{"jobs", "get"}, "jobs get needs the <job_id>"},
		{[]string{"jobs", "history"}, "jobs history needs -kind or -schedule"},
		{[]string{"queue", "add"}, "queue add needs the <queue>"},
		{[]string{"queue", "rm"}, "queue rm needs the <queue>"},
		{[]string{"submit"}, "submit needs the <queue> and the <kind>"},
		{[]string{"submit", "default"}, "submit needs the <kind>"},
		{[]string{"config", "print"}, "config print needs the <service> (agent, dev, scheduler or supervisor)"},
		{[]string{"config", "print", "nosuch"}, `config print: unknown service "nosuch"`},
		{[]string{"completion"}, "completion needs the <shell> (bash or zsh)"},
		{[]string{"completion", "fish"}, `completion: unknown shell "fish"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			// No server listens there: every one of these fails before connecting.
			args := tc.args
			if c := commandAt(args); c != nil && c.fleet {
				args = append(append([]string(nil), args...), "-server", "nats://127.0.0.1:1")
			}
			err := run(context.Background(), args, &bytes.Buffer{})
			require.ErrorContains(t, err, tc.want)
			var ue *usageError
			require.ErrorAs(t, err, &ue)
			assert.Equal(t, 2, exitCode(err))
			assert.Contains(t, ue.hint(), "Run 'jetfleet")
		})
	}
}

// commandAt is the command args name, or nil.
func commandAt(args []string) *command {
	c := root
	for _, a := range args {
		if next := c.sub(a); next != nil {
			c = next
		}
	}
	if c == root {
		return nil
	}
	return c
}

func TestParseArgsTakesFlagsAnywhere(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args, want []string
		note       string
	}{
		{[]string{"-note", "n", "id"}, []string{"id"}, "n"},
		{[]string{"id", "-note", "n"}, []string{"id"}, "n"},
		{[]string{"a", "-note", "n", "b"}, []string{"a", "b"}, "n"},
		{[]string{"a", "--", "-note", "b"}, []string{"a", "-note", "b"}, ""},
		{[]string{"q", "k", "-"}, []string{"q", "k", "-"}, ""},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		note := fs.String("note", "", "")
		got, err := parseArgs(fs, tc.args)
		require.NoError(t, err)
		assert.Equal(t, tc.want, got, "%q", tc.args)
		assert.Equal(t, tc.note, *note, "%q", tc.args)
	}
}

// TestJSONViewsCoverEveryDuration walks the types the CLI prints as JSON:
// every time.Duration field (which encoding/json writes as nanoseconds)
// must be one a view in output.go converts. A new one fails here.
func TestJSONViewsCoverEveryDuration(t *testing.T) {
	t.Parallel()
	printed := []any{jetfleet.AgentsResponse{}, jetfleet.FleetStatus{}, jetfleet.QueuesResponse{}, jetfleet.QueueAddResponse{},
		jetfleet.QueueRemoveResponse{}, jetfleet.RunningJobsResponse{}, jetfleet.JobDetail{}, jetfleet.HistoryResponse{},
		jetfleet.DLQListResponse{}, jetfleet.DeadLetterEntry{}, jetfleet.ReplayResponse{}, jetfleet.PurgeResponse{},
		jetfleet.ScheduleInfo{}, jetfleet.ScheduleListResponse{}, jetfleet.TriggerResponse{}, jetfleet.PreviewResponse{},
		jetfleet.BackfillResponse{}, submitted{}, bench.Report{}, jetfleet.WorkflowInfo{}, []jetfleet.WorkflowInfo{},
		jetfleet.WorkflowNameRequest{}, jetfleet.WorkflowRunResponse{}, []jetfleet.WorkflowRunSummary{}, jetfleet.WorkflowRunDetail{}}
	found := map[string]bool{}
	seen := map[reflect.Type]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		switch t.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Map:
			walk(t.Elem())
			return
		case reflect.Struct:
		default:
			return
		}
		if seen[t] || t == reflect.TypeFor[time.Time]() {
			return
		}
		seen[t] = true
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() || f.Tag.Get("json") == "-" {
				continue
			}
			if f.Type == reflect.TypeFor[time.Duration]() {
				found[t.String()+"."+f.Name] = true
				continue
			}
			walk(f.Type)
		}
	}
	for _, v := range printed {
		walk(reflect.TypeOf(v))
	}
	converted := map[string]bool{"jetfleet.AgentInfo.Interval": true, "jetfleet.AgentInfo.SilentFor": true,
		"jetfleet.QueueStatus.AckWait": true, "jetfleet.HistoryStats.P50": true, "jetfleet.HistoryStats.P95": true,
		"bench.Config.Duration": true, "bench.Config.ScheduleLead": true, "bench.Config.LeaseTTL": true}
	assert.Equal(t, converted, found, "time.Duration fields printed as JSON; convert new ones in output.go")

	// And the views print them as seconds.
	data, err := json.Marshal(agentsJSON([]jetfleet.AgentInfo{{ID: "a", Interval: 1500 * time.Millisecond, SilentFor: 2 * time.Second}}))
	require.NoError(t, err)
	assert.Contains(t, string(data), `"interval":"1.5s"`)
	assert.Contains(t, string(data), `"silent_for":"2s"`)
	assert.Contains(t, string(data), `"id":"a"`)
	data, err = json.Marshal(benchJSON(&bench.Report{Config: bench.Config{Duration: 500 * time.Millisecond, LeaseTTL: 5 * time.Second}}))
	require.NoError(t, err)
	assert.Contains(t, string(data), `"duration":"0.5s"`)
	assert.Contains(t, string(data), `"lease_ttl":"5s"`)
}

// TestCredentials is not parallel: it sets the environment.
func TestCredentials(t *testing.T) {
	t.Setenv("NATS_USER", "bob")
	t.Setenv("NATS_PASSWORD", "hunter2")
	t.Setenv("NATS_TOKEN", "")
	t.Setenv("NATS_CREDS", "")
	t.Setenv("NATS_NKEY", "")
	for _, tc := range []struct {
		flags credentialFlags
		want  natsconn.Config
		err   string
	}{
		{flags: credentialFlags{}, want: natsconn.Config{User: "bob", Password: "hunter2"}},
		{flags: credentialFlags{user: "alice"}, want: natsconn.Config{User: "alice", Password: "hunter2"}},
		{flags: credentialFlags{user: "alice", password: "s3cret"}, want: natsconn.Config{User: "alice", Password: "s3cret"}},
		{flags: credentialFlags{token: "t0ken"}, err: "set only one of -user, -token, -creds and -nkey (or of $NATS_USER, $NATS_TOKEN"},
	} {
		var cfg natsconn.Config
		err := tc.flags.apply(&cfg)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, tc.want, cfg, "%+v", tc.flags)
	}
	t.Setenv("NATS_USER", "")
	var cfg natsconn.Config
	assert.ErrorContains(t, (&credentialFlags{}).apply(&cfg), "-password ($NATS_PASSWORD) needs -user ($NATS_USER)")
	t.Setenv("NATS_PASSWORD", "")
	require.NoError(t, (&credentialFlags{token: "t0ken"}).apply(&cfg))
	assert.Equal(t, natsconn.Config{Token: "t0ken"}, cfg)

	var out bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"status", "-h"}, &out))
	assert.NotContains(t, out.String(), "hunter2", "help never shows a secret of the environment")
}

// TestMainExitStatus runs the binary's main in a child process (this test
// binary, see TestMainProcess) to show the exit statuses.
func TestMainExitStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args           []string
		status         int
		stdout, stderr string
	}{
		{[]string{"schedule", "add", "-h"}, 0, "usage: jetfleet schedule add", ""},
		{[]string{"help", "dlq"}, 0, "usage: jetfleet dlq <ls|show|replay|purge>", ""},
		{[]string{"schedule", "add", "-server", "nats://127.0.0.1:1"}, 2, "",
			"jetfleet: schedule add needs the schedule <id> (or -f file)\nRun 'jetfleet schedule add -h' for usage.\n"},
		{[]string{"status", "-server", "nats://127.0.0.1:1", "-timeout", "200ms"}, 1, "", "jetfleet: connect to NATS at nats://127.0.0.1:1"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			status, stdout, stderr := runMain(t, tc.args...)
			assert.Equal(t, tc.status, status, "stderr: %s", stderr)
			assert.Contains(t, stdout, tc.stdout)
			assert.Contains(t, stderr, tc.stderr)
		})
	}
}

// runMain runs jetfleet's main with args in a child process.
func runMain(t *testing.T, args ...string) (status int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"--"}, args...)...) // TestMain runs main
	cmd.Env = append(os.Environ(), "JETFLEET_TEST_MAIN=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return exitErr.ExitCode(), out.String(), errOut.String()
	}
	require.NoError(t, err)
	return 0, out.String(), errOut.String()
}
