// Package devfleet runs a whole jetfleet fleet in one process for
// development: an embedded NATS server with JetStream (file store in a local
// data directory), the scheduler, an agent with the demo kinds echo, sleep
// and fail, and the supervisor, each on its own connection as in
// production. `jetfleet dev` is a thin wrapper around it.
package devfleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/agent/demo"
	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/dashboard"
	"github.com/jetfleet/jetfleet/pkg/embedded"
	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Config is the configuration of `jetfleet dev`: the shared sections, the
// embedded server, and a section per component. The nats section is not
// used: components connect to the embedded server.
type Config struct {
	service.Base `koanf:",squash"`
	Embedded     EmbeddedConfig    `koanf:"embedded"`
	Scheduler    scheduler.Config  `koanf:"scheduler"`
	Agent        agent.Config      `koanf:"agent"`
	Supervisor   supervisor.Config `koanf:"supervisor"`
	// Dashboard is the web dashboard (dashboard.listen "off" runs none).
	Dashboard dashboard.Config `koanf:"dashboard"`
}

// EmbeddedConfig configures the embedded NATS server.
type EmbeddedConfig struct {
	// Host to listen on. Defaults to 127.0.0.1.
	Host string `koanf:"host"`
	// Port for clients. Defaults to 4222; -1 picks a free port.
	Port int `koanf:"port"`
	// DataDir holds the JetStream file store. Defaults to .jetfleet/data.
	DataDir string `koanf:"data_dir"`
	// SyncInterval is "always" (every write reaches the disk before it is
	// acknowledged), a duration, or empty for the server default (2m).
	SyncInterval string `koanf:"sync_interval"`
	// ConfigFile is an optional nats-server configuration file (accounts,
	// users, permissions).
	ConfigFile string `koanf:"config_file"`
}

// Defaults of the dev fleet.
const (
	DefaultDataDir  = ".jetfleet/data"
	DefaultPort     = 4222
	DefaultHTTPAddr = "127.0.0.1:9100"
	// DashboardOff as dashboard.listen runs no dashboard.
	DashboardOff = "off"
)

// DefaultConfig returns the dev fleet's defaults.
func DefaultConfig() *Config {
	c := &Config{}
	c.Telemetry.HTTPAddr = DefaultHTTPAddr
	c.Telemetry.LogFormat = "text"
	c.Embedded.Port = DefaultPort
	c.Embedded.DataDir = DefaultDataDir
	c.Agent.ID = "dev-agent"
	return c
}

// ApplyDefaults implements service.Defaulter.
func (c *Config) ApplyDefaults() {
	c.Base.ApplyDefaults()
	c.Scheduler = c.Scheduler.WithDefaults(c.Topology.LeaseTTL)
	c.Supervisor = c.Supervisor.WithDefaults(c.Topology.LeaseTTL)
	c.Agent = c.Agent.WithDefaults()
	if c.Dashboard.Listen != DashboardOff {
		c.Dashboard = c.Dashboard.WithDefaults()
	}
	if c.Embedded.Host == "" {
		c.Embedded.Host = "127.0.0.1"
	}
}

// Validate checks every section.
func (c *Config) Validate() error {
	var errs []error
	ttl := c.Topology.WithDefaults().LeaseTTL
	errs = append(errs, c.Base.Validate(), c.Agent.Validate("agent"), c.Scheduler.Validate("scheduler", ttl),
		c.Supervisor.Validate("supervisor", ttl))
	if c.Dashboard.Listen != DashboardOff {
		errs = append(errs, c.Dashboard.Validate("dashboard"))
	}
	if c.Embedded.Port < -1 || c.Embedded.Port > 65535 {
		errs = append(errs, config.Invalid("embedded.port", "must be -1 (any free port) or 0 to 65535, got %d", c.Embedded.Port))
	}
	if _, _, err := c.Embedded.sync(); err != nil {
		errs = append(errs, config.Invalid("embedded.sync_interval", "%v", err))
	}
	return errors.Join(errs...)
}

func (e EmbeddedConfig) sync() (always bool, interval time.Duration, err error) {
	switch e.SyncInterval {
	case "":
		return false, 0, nil
	case "always":
		return true, 0, nil
	}
	d, err := time.ParseDuration(e.SyncInterval)
	if err != nil || d <= 0 {
		return false, 0, fmt.Errorf("%q is not \"always\" or a positive duration such as 1s", e.SyncInterval)
	}
	return false, d, nil
}

// Options are what tests and the CLI pass besides the configuration.
type Options struct {
	// Logger of every component. Defaults to one built from cfg.Telemetry on stderr.
	Logger *slog.Logger
	// SpanExporter receives every span synchronously (tests); default: OTLP
	// when configured in the environment, else none.
	SpanExporter sdktrace.SpanExporter
}

// Fleet is a running dev fleet; it is a lifecycle component.
type Fleet struct {
	cfg  *Config
	opts Options

	srv        *server.Server
	telemetry  *telemetry.Telemetry
	http       *telemetry.HTTPServer
	envs       []*service.Env
	group      *lifecycle.Group
	agent      *agent.Agent
	scheduler  *scheduler.Scheduler
	supervisor *supervisor.Supervisor
	dashboard  *dashboard.Dashboard
}

// New returns a dev fleet for cfg (which Validate has accepted).
func New(cfg *Config, opts Options) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		logger, err := telemetry.NewLogger(os.Stderr, cfg.Telemetry)
		if err != nil {
			return nil, err
		}
		opts.Logger = logger
	}
	return &Fleet{cfg: cfg, opts: opts}, nil
}

// Name implements lifecycle.Named.
func (f *Fleet) Name() string { return "dev fleet" }

// Start starts the embedded server, then the supervisor, the scheduler and
// the agent, each with its own connection.
func (f *Fleet) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			f.shutdown(context.WithoutCancel(ctx))
		}
	}()
	always, interval, _ := f.cfg.Embedded.sync()
	dataDir, err := filepath.Abs(f.cfg.Embedded.DataDir)
	if err != nil {
		return err
	}
	f.srv, err = embedded.Start(embedded.Options{
		Host: f.cfg.Embedded.Host, Port: f.cfg.Embedded.Port, StoreDir: dataDir,
		SyncAlways: always, SyncInterval: interval, ConfigFile: f.cfg.Embedded.ConfigFile,
		MaxPayload: serverMaxPayload(int64(f.cfg.Topology.WithDefaults().MaxJobSize)),
	})
	if err != nil {
		return err
	}
	base := f.cfg.Base
	base.NATS.URL = f.srv.ClientURL()

	f.telemetry, err = telemetry.Setup(ctx, telemetry.Options{ServiceName: "jetfleet-dev", SpanExporter: f.opts.SpanExporter})
	if err != nil {
		return err
	}
	logger := f.opts.Logger
	connect := func(name string) (*service.Env, error) {
		env, err := service.Connect(ctx, name, &base, f.telemetry, logger)
		if err != nil {
			return nil, err
		}
		f.envs = append(f.envs, env)
		return env, nil
	}

	var components []lifecycle.Component
	if f.cfg.Telemetry.HTTPAddr != "" {
		f.http = telemetry.NewHTTPServer(f.cfg.Telemetry.HTTPAddr, f.telemetry.Registry, logger)
		components = append(components, f.http)
	}
	supEnv, err := connect("supervisor")
	if err != nil {
		return err
	}
	if f.supervisor, err = supervisor.New(f.cfg.Supervisor, supEnv, clock.Real()); err != nil {
		return err
	}
	schedEnv, err := connect("scheduler")
	if err != nil {
		return err
	}
	if f.scheduler, err = scheduler.New(f.cfg.Scheduler, schedEnv, clock.Real()); err != nil {
		return err
	}
	agentEnv, err := connect("agent")
	if err != nil {
		return err
	}
	if f.agent, err = agent.New(agentEnv.Conn, f.cfg.Agent, agent.WithEnv(agentEnv)); err != nil {
		return err
	}
	if err := demo.RegisterAll(f.agent, agentEnv.Logger); err != nil {
		return err
	}
	components = append(components, f.supervisor, f.scheduler, f.agent)
	if f.cfg.Dashboard.Listen != DashboardOff {
		dashEnv, err := connect("dashboard")
		if err != nil {
			return err
		}
		if f.dashboard, err = dashboard.New(f.cfg.Dashboard, dashEnv.Conn, dashboard.Options{Logger: dashEnv.ComponentLogger("dashboard")}); err != nil {
			return err
		}
		components = append(components, f.dashboard)
	}
	if f.http != nil {
		f.http.AddReadyCheck("nats", service.NATSReady(agentEnv.Conn))
		f.http.AddReadyCheck("scheduler", f.scheduler.Ready)
		f.http.AddReadyCheck("supervisor", f.supervisor.Ready)
	}
	f.group = lifecycle.NewGroup("dev fleet", components...)
	if err := f.group.Start(ctx); err != nil {
		return err
	}
	// Alone, the scheduler and the supervisor lead at once; a lease left by
	// a dev fleet that was killed lives on for the lease TTL.
	leadCtx, cancel := context.WithTimeout(ctx, 2*f.cfg.Topology.WithDefaults().LeaseTTL+5*time.Second)
	defer cancel()
	if err := f.scheduler.WaitLeading(leadCtx, true); err != nil {
		return fmt.Errorf("the scheduler did not become leader: %w", err)
	}
	if err := f.supervisor.WaitLeading(leadCtx, true); err != nil {
		return fmt.Errorf("the supervisor did not become leader: %w", err)
	}
	return nil
}

// Stop stops the components in reverse order, then the server, within ctx.
func (f *Fleet) Stop(ctx context.Context) error {
	var err error
	if f.group != nil {
		err = f.group.Stop(ctx)
	}
	f.shutdown(ctx)
	return err
}

// shutdown closes connections, telemetry and the server.
func (f *Fleet) shutdown(ctx context.Context) {
	for _, env := range f.envs {
		env.Close()
	}
	f.envs = nil
	if f.telemetry != nil {
		_ = f.telemetry.Shutdown(ctx)
		f.telemetry = nil
	}
	if f.srv != nil {
		f.srv.Shutdown()
		f.srv.WaitForShutdown()
		f.srv = nil
	}
}

// serverMaxPayload is a max_payload that fits dead letters of jobs up to
// maxJobSize: the server default (1MiB) or more.
func serverMaxPayload(maxJobSize int64) int32 {
	need := maxJobSize*4/3 + 96<<10 + 1
	return int32(max(1<<20, need))
}

// DashboardURL is where the dashboard serves ("" when it runs none).
func (f *Fleet) DashboardURL() string {
	if f.dashboard == nil {
		return ""
	}
	return f.dashboard.URL()
}

// ClientURL is where NATS clients connect.
func (f *Fleet) ClientURL() string { return f.srv.ClientURL() }

// Summary says where everything is, for the person who started the fleet.
func (f *Fleet) Summary(w io.Writer) {
	always, interval, _ := f.cfg.Embedded.sync()
	durability := "server default sync interval (2m)"
	switch {
	case always:
		durability = "sync_interval always"
	case interval > 0:
		durability = "sync_interval " + interval.String()
	}
	dataDir, _ := filepath.Abs(f.cfg.Embedded.DataDir)
	lines := []string{
		"jetfleet dev fleet is running",
		fmt.Sprintf("  NATS + JetStream   %s   (data in %s, %s)", f.ClientURL(), dataDir, durability),
		fmt.Sprintf("  agent %-12s queues %s, kinds %s", f.agent.ID(), strings.Join(f.cfg.Agent.WithDefaults().Queues, ","), strings.Join(f.agent.Kinds(), ", ")),
		"  scheduler          leader election in bucket leases; API jetfleet.api.scheduler.*",
		"  supervisor         rescues, dead letters, escalation; API jetfleet.api.dlq.*, jetfleet.api.supervisor.*",
	}
	if f.dashboard != nil {
		lines = append(lines, fmt.Sprintf("  dashboard          %s", f.dashboard.URL()))
	}
	if f.http != nil {
		lines = append(lines, fmt.Sprintf("  metrics, health    http://%s/metrics  /healthz  /readyz", f.http.Addr()))
	}
	lines = append(lines,
		"",
		"Try:",
		fmt.Sprintf(`  go run ./services/jetfleet submit -server %s default echo '{"hello":"world"}'`, f.ClientURL()),
		fmt.Sprintf(`  go run ./services/jetfleet schedule add -server %s -every 10s -kind echo every-10s`, f.ClientURL()),
		"Stop with Ctrl-C; queued jobs and schedules survive a restart.",
	)
	fmt.Fprintln(w, strings.Join(lines, "\n"))
}
