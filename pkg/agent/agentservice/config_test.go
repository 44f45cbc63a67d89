package agentservice_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent/agentservice"
	"github.com/jetfleet/jetfleet/pkg/agent/command"
	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/service"
)

const (
	fleetYAML = "../../../config/fleet.yaml"
	agentYAML = "../../../config/agent.yaml"
)

func load(t *testing.T, files ...string) (*agentservice.ServiceConfig, error) {
	t.Helper()
	cfg := agentservice.DefaultServiceConfig()
	_, err := config.Load(cfg, config.Options{Files: files, Environ: []string{}})
	return cfg, err
}

func writeYAML(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.yaml")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	return path
}

func TestShippedConfigLoads(t *testing.T) {
	t.Parallel()
	cfg := agentservice.DefaultServiceConfig()
	require.NoError(t, service.LoadConfig(cfg, service.Flags{Files: []string{fleetYAML, agentYAML}}))
	assert.Equal(t, agentservice.DefaultHTTPAddr, cfg.Telemetry.HTTPAddr)
	assert.Equal(t, []string{"default"}, cfg.Agent.Queues)
	echo := cfg.Handlers["echo-exec"]
	assert.Equal(t, agentservice.TypeExec, echo.Type)
	assert.Equal(t, "/bin/cat", echo.Exec.Command)
	assert.Equal(t, time.Minute, echo.Timeout)
	assert.Equal(t, config.ByteSize(256<<20), echo.Exec.Limits.Memory)
	_, err := command.New(echo.Exec)
	assert.NoError(t, err, "the shipped handler runs on a stock Linux")
}

// TestShippedExamplesAreValid uncomments the handler examples of the
// shipped configuration and loads them.
func TestShippedExamplesAreValid(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(agentYAML)
	require.NoError(t, err)
	var examples []string
	var in bool
	start := regexp.MustCompile(`^  # ([a-z-]+):$`)
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case start.MatchString(line):
			in = true
		case !strings.HasPrefix(line, "  # "):
			in = false
		}
		if in {
			examples = append(examples, "  "+strings.TrimPrefix(line, "  # "))
		}
	}
	require.NotEmpty(t, examples)
	cfg, err := load(t, writeYAML(t, "handlers:\n"+strings.Join(examples, "\n")+"\n"))
	require.NoError(t, err, "examples:\n%s", strings.Join(examples, "\n"))
	assert.Equal(t, agentservice.TypeExec, cfg.Handlers["resize-image"].Type)
	assert.Equal(t, []int{64, 65}, cfg.Handlers["resize-image"].Exec.NonRetryableExitCodes)
	assert.Equal(t, 5*time.Minute, cfg.Handlers["resize-image"].Exec.Limits.CPUTime)
	assert.Equal(t, agentservice.TypeHTTP, cfg.Handlers["notify"].Type)
	assert.Equal(t, "Bearer change-me", cfg.Handlers["notify"].HTTP.Headers["Authorization"])
	assert.Equal(t, 2*time.Second, cfg.Handlers["notify"].KindOptions().Retry.InitialDelay)
}

func TestConfigErrorsNameKeyAndFile(t *testing.T) {
	t.Parallel()
	path := writeYAML(t, `
handlers:
  bad-type: {type: shell, command: /bin/sh}
  no-type: {command: /bin/cat}
  no-command: {type: exec}
  relative: {type: exec, command: bin/tool, kill_grace: -1s, limits: {memory: 10, open_files: 1}}
  mixed: {type: exec, command: /bin/cat, url: "http://example.com", headers: {A: b}}
  hook: {type: http, url: "ftp://example.com/x", command: /bin/cat, limits: {cpu_time: 1s}}
  negative: {type: exec, command: /bin/cat, timeout: -1s, max_attempts: -1, concurrency: -2, backoff: {multiplier: 0.5, jitter: 2}}
  "not a kind": {type: exec, command: /bin/cat}
  bad-demo: {type: demo, demo: juggle}
  demo-mixed: {type: demo, command: /bin/cat}
  exec-demo: {type: exec, command: /bin/cat, demo: echo}
`)
	_, err := load(t, path)
	require.Error(t, err)
	source := "(from file " + path + ")"
	for key, reason := range map[string]string{
		"handlers.bad-type.type":               `unknown handler type "shell"`,
		"handlers.no-type.type":                "is required",
		"handlers.no-command.command":          "is required",
		"handlers.relative.command":            "must be an absolute path",
		"handlers.relative.kill_grace":         "must not be negative",
		"handlers.relative.limits.memory":      "must be at least 1MiB",
		"handlers.relative.limits.open_files":  "must be at least 4",
		"handlers.mixed.url":                   "is a setting of http handlers",
		"handlers.mixed.headers":               "is a setting of http handlers",
		"handlers.hook.url":                    "must be an absolute http or https URL",
		"handlers.hook.command":                "is a setting of exec handlers",
		"handlers.hook.limits.cpu_time":        "is a setting of exec handlers",
		"handlers.negative.timeout":            "must not be negative",
		"handlers.negative.max_attempts":       "must not be negative",
		"handlers.negative.concurrency":        "must not be negative",
		"handlers.negative.backoff.multiplier": "must be at least 1",
		"handlers.negative.backoff.jitter":     "must be at most 1",
		"handlers.not a kind":                  "invalid kind",
		"handlers.bad-demo.demo":               `unknown demo "juggle"`,
		"handlers.demo-mixed.command":          "is a setting of exec handlers",
		"handlers.exec-demo.demo":              "is a setting of demo handlers",
	} {
		assert.ErrorContains(t, err, "config key "+key+" "+source+": "+reason)
	}
}

func TestUnknownHandlerKeyIsRefused(t *testing.T) {
	t.Parallel()
	path := writeYAML(t, "handlers:\n  echo: {type: exec, comand: /bin/cat}\n")
	_, err := load(t, path)
	assert.ErrorContains(t, err, "config key handlers.echo.comand (from file "+path+"): unknown key")
}

func TestHandlersAreRequired(t *testing.T) {
	t.Parallel()
	_, err := load(t)
	assert.ErrorContains(t, err, "config key handlers (from defaults): configure at least one handler")
}

func TestApplyDefaultsShowsWhatIsInForce(t *testing.T) {
	t.Parallel()
	cfg, err := load(t, writeYAML(t, `
agent: {retry: {max_attempts: 7, initial_delay: 3s}}
handlers:
  run: {type: exec, command: /bin/cat, backoff: {max_delay: 1m}}
  post: {type: http, url: "http://127.0.0.1:1/x", timeout: 10s}
`))
	require.NoError(t, err)
	var d service.Defaulter = cfg
	d.ApplyDefaults()
	assert.Empty(t, cfg.Agent.ID, "made when the agent starts")
	run := cfg.Handlers["run"]
	assert.Equal(t, command.DefaultKillGrace, run.Exec.KillGrace)
	assert.Equal(t, command.ExitRetryable, run.Exec.OtherExitCodes)
	assert.Equal(t, 7, run.MaxAttempts)
	assert.Equal(t, agentservice.BackoffConfig{InitialDelay: 3 * time.Second, Multiplier: 2, MaxDelay: time.Minute, Jitter: 0.2}, run.Backoff)
	assert.Equal(t, 30*time.Minute, run.Timeout)
	post := cfg.Handlers["post"]
	assert.Equal(t, 10*time.Second, post.Timeout)
	assert.Equal(t, "application/json", post.HTTP.ContentType)
	require.NoError(t, cfg.Validate(), "the defaulted configuration is still valid")
}
