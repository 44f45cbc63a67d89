package config_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/config"
)

type queueConfig struct {
	AckWait    time.Duration `koanf:"ack_wait"`
	MaxDeliver int           `koanf:"max_deliver"`
}

type Base struct {
	Grace time.Duration `koanf:"grace"`
}

type testConfig struct {
	Base `koanf:",squash"`
	NATS struct {
		URL      string `koanf:"url"`
		Password string `koanf:"password" secret:"true"`
	} `koanf:"nats"`
	Agent struct {
		Concurrency int               `koanf:"concurrency"`
		Queues      []string          `koanf:"queues"`
		Heartbeat   time.Duration     `koanf:"heartbeat"`
		MaxPayload  config.ByteSize   `koanf:"max_payload"`
		Labels      map[string]string `koanf:"labels"`
	} `koanf:"agent"`
	Queues map[string]queueConfig `koanf:"queues"`
}

func (c *testConfig) Validate() error {
	var errs []error
	if c.Agent.Concurrency < 1 {
		errs = append(errs, config.Invalid("agent.concurrency", "must be at least 1, got %d", c.Agent.Concurrency))
	}
	for name, q := range c.Queues {
		if q.MaxDeliver < 0 {
			errs = append(errs, config.Invalid("queues."+name+".max_deliver", "must not be negative"))
		}
	}
	return errors.Join(errs...)
}

func defaults() *testConfig {
	c := &testConfig{}
	c.NATS.URL = "nats://127.0.0.1:4222"
	c.Grace = time.Second
	c.Agent.Concurrency = 10
	c.Agent.Queues = []string{"default"}
	c.Agent.Heartbeat = time.Second
	c.Queues = map[string]queueConfig{"default": {AckWait: 30 * time.Second, MaxDeliver: 20}}
	return c
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.yaml")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

func TestDefaultsApplyWithoutLayers(t *testing.T) {
	t.Parallel()
	cfg := defaults()
	src, err := config.Load(cfg, config.Options{Environ: []string{}})
	require.NoError(t, err)
	assert.Equal(t, 10, cfg.Agent.Concurrency)
	assert.Equal(t, "defaults", src.Of("agent.concurrency"))
}

func TestPrecedenceDefaultsFileEnvFlags(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
nats:
  url: nats://file:4222
agent:
  concurrency: 20
  heartbeat: 2s
  queues: [a, b]
  max_payload: 2MiB
queues:
  reports:
    ack_wait: 5m
    max_deliver: 3
`)
	cfg := defaults()
	src, err := config.Load(cfg, config.Options{
		Files:   []string{path},
		Environ: []string{"JETFLEET_AGENT_CONCURRENCY=30", "JETFLEET_AGENT_QUEUES=x, y", "PATH=/bin"},
		Sets:    []string{"agent.heartbeat=3s", "grace=5s"},
	})
	require.NoError(t, err)
	assert.Equal(t, "nats://file:4222", cfg.NATS.URL, "file beats defaults")
	assert.Equal(t, 30, cfg.Agent.Concurrency, "env beats file")
	assert.Equal(t, []string{"x", "y"}, cfg.Agent.Queues, "env lists are comma-separated")
	assert.Equal(t, 3*time.Second, cfg.Agent.Heartbeat, "flags beat env and file")
	assert.Equal(t, 5*time.Second, cfg.Grace, "squashed fields are top-level keys")
	assert.Equal(t, config.ByteSize(2<<20), cfg.Agent.MaxPayload)
	assert.Equal(t, queueConfig{AckWait: 5 * time.Minute, MaxDeliver: 3}, cfg.Queues["reports"])
	assert.Contains(t, cfg.Queues, "default", "map entries from defaults survive")

	assert.Equal(t, "file "+path, src.Of("nats.url"))
	assert.Equal(t, "env JETFLEET_AGENT_CONCURRENCY", src.Of("agent.concurrency"))
	assert.Equal(t, "flag --set agent.heartbeat", src.Of("agent.heartbeat"))
	assert.Equal(t, "defaults", src.Of("nats.password"))
}

func TestUnsetKeyOfMapEntryHasTheEntrysSource(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "queues:\n  reports:\n    ack_wait: 5m\n")
	src, err := config.Load(defaults(), config.Options{Files: []string{path}, Environ: []string{}})
	require.NoError(t, err)
	assert.Equal(t, "file "+path, src.Of("queues.reports.max_deliver"), "the entry was written there")
	assert.Equal(t, "defaults", src.Of("queues.default.max_deliver"))
	assert.Equal(t, "defaults", src.Of("agent.concurrency"), "struct sections are no entries")
}

func TestLaterFilesWin(t *testing.T) {
	t.Parallel()
	first := writeFile(t, "agent: {concurrency: 2}\nnats: {url: nats://one}\n")
	second := writeFile(t, "agent: {concurrency: 3}\n")
	cfg := defaults()
	_, err := config.Load(cfg, config.Options{Files: []string{first, second}, Environ: []string{}})
	require.NoError(t, err)
	assert.Equal(t, 3, cfg.Agent.Concurrency)
	assert.Equal(t, "nats://one", cfg.NATS.URL)
}

func TestUnknownKeyNamesKeyAndFile(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "agent:\n  concurrencyy: 3\n")
	_, err := config.Load(defaults(), config.Options{Files: []string{path}, Environ: []string{}})
	var ke *config.KeyError
	require.ErrorAs(t, err, &ke)
	assert.Equal(t, "agent.concurrencyy", ke.Key)
	assert.Equal(t, "file "+path, ke.Source)
	assert.Contains(t, err.Error(), "unknown key")
}

func TestUnknownKeySuggestsNearKey(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "concurrency: 3\n")
	_, err := config.Load(defaults(), config.Options{Files: []string{path}, Environ: []string{}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "did you mean agent.concurrency?")
}

func TestUnknownEnvVariable(t *testing.T) {
	t.Parallel()
	_, err := config.Load(defaults(), config.Options{Environ: []string{"JETFLEET_AGENT_CONCURENCY=3"}})
	require.ErrorContains(t, err, "JETFLEET_AGENT_CONCURENCY does not name a config key")

	_, err = config.Load(defaults(), config.Options{Environ: []string{"JETFLEET_CONFIG=x.yaml"}, IgnoreEnv: []string{"JETFLEET_CONFIG"}})
	require.NoError(t, err)
}

func TestWrongTypeNamesKeyAndSource(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "agent:\n  heartbeat: often\n")
	_, err := config.Load(defaults(), config.Options{Files: []string{path}, Environ: []string{}})
	var ke *config.KeyError
	require.ErrorAs(t, err, &ke)
	assert.Equal(t, "agent.heartbeat", ke.Key)
	assert.Equal(t, "file "+path, ke.Source)
	assert.Contains(t, ke.Reason, "a duration")

	_, err = config.Load(defaults(), config.Options{Environ: []string{"JETFLEET_AGENT_CONCURRENCY=lots"}})
	require.ErrorAs(t, err, &ke)
	assert.Equal(t, "env JETFLEET_AGENT_CONCURRENCY", ke.Source)
	assert.Contains(t, ke.Reason, "a whole number")

	_, err = config.Load(defaults(), config.Options{Sets: []string{"agent.max_payload=huge"}, Environ: []string{}})
	require.ErrorAs(t, err, &ke)
	assert.Equal(t, "flag --set agent.max_payload", ke.Source)
}

func TestInvalidValueNamesKeyAndSource(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "agent:\n  concurrency: 0\nqueues:\n  reports:\n    max_deliver: -1\n")
	_, err := config.Load(defaults(), config.Options{Files: []string{path}, Environ: []string{}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "config key agent.concurrency (from file "+path+"): must be at least 1, got 0")
	assert.Contains(t, err.Error(), "config key queues.reports.max_deliver (from file "+path+"): must not be negative")
}

func TestBadSetFlag(t *testing.T) {
	t.Parallel()
	_, err := config.Load(defaults(), config.Options{Sets: []string{"novalue"}, Environ: []string{}})
	require.ErrorContains(t, err, "want key=value")
}

func TestMissingFile(t *testing.T) {
	t.Parallel()
	_, err := config.Load(defaults(), config.Options{Files: []string{"/nonexistent/agent.yaml"}, Environ: []string{}})
	require.ErrorContains(t, err, "/nonexistent/agent.yaml")
}

func TestPrintRedactsSecrets(t *testing.T) {
	t.Parallel()
	cfg := defaults()
	cfg.NATS.Password = "hunter2"
	cfg.Agent.MaxPayload = 1 << 20
	var buf bytes.Buffer
	require.NoError(t, config.Print(&buf, cfg))
	out := buf.String()
	assert.NotContains(t, out, "hunter2")
	assert.Contains(t, out, "password: <redacted>")
	assert.Contains(t, out, "heartbeat: 1s")
	assert.Contains(t, out, "max_payload: 1MiB")
	assert.Contains(t, out, "ack_wait: 30s")
	assert.Regexp(t, `(?m)^grace: 1s$`, out, "squashed fields print at the top level")
}

func TestByteSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]config.ByteSize{"512": 512, "64KiB": 64 << 10, "1MiB": 1 << 20, "2 GB": 2 << 30, "0": 0} {
		var b config.ByteSize
		require.NoError(t, b.UnmarshalText([]byte(in)), in)
		assert.Equal(t, want, b, in)
	}
	var b config.ByteSize
	assert.Error(t, b.UnmarshalText([]byte("-1")))
	assert.Error(t, b.UnmarshalText([]byte("lots")))
	text, _ := config.ByteSize(1536).MarshalText()
	assert.Equal(t, "1536", string(text))
}
