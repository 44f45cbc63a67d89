// Package service is the common frame of every jetfleet service binary:
// configuration (defaults → YAML files → JETFLEET_* → --set), logger,
// telemetry, NATS connection, topology provisioning, the /metrics, /healthz
// and /readyz endpoint, and a run until SIGINT/SIGTERM with a bounded
// graceful stop.
package service

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/natsconn"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// Base is the configuration every service shares. Service configurations
// embed it with `koanf:",squash"`, so its keys are top-level.
type Base struct {
	NATS      natsconn.Config  `koanf:"nats"`
	Topology  topology.Config  `koanf:"topology"`
	Telemetry telemetry.Config `koanf:"telemetry"`
	// ShutdownGrace bounds a graceful stop after SIGINT/SIGTERM. Defaults to 30s.
	ShutdownGrace time.Duration `koanf:"shutdown_grace"`
}

// DefaultShutdownGrace is Base.ShutdownGrace's default.
const DefaultShutdownGrace = 30 * time.Second

// ServiceBase returns b; every configuration embedding Base has it.
func (b *Base) ServiceBase() *Base { return b }

// Validate checks the shared sections.
func (b *Base) Validate() error {
	var errs []error
	errs = append(errs, b.NATS.Validate("nats"), b.Topology.Validate("topology"))
	if err := b.Telemetry.Validate("telemetry"); err != nil {
		errs = append(errs, err)
	}
	if b.ShutdownGrace < 0 {
		errs = append(errs, config.Invalid("shutdown_grace", "must not be negative"))
	}
	return errors.Join(errs...)
}

// ApplyDefaults replaces zero values of the shared sections by their
// defaults, for showing the effective configuration.
func (b *Base) ApplyDefaults() {
	b.NATS = b.NATS.WithDefaults()
	b.Topology = b.Topology.WithDefaults()
	b.Telemetry = b.Telemetry.WithDefaults()
	b.ShutdownGrace = b.Grace()
}

// Defaulter is implemented by configurations that can show their
// effective values: every zero value replaced by its default.
type Defaulter interface {
	ApplyDefaults()
}

// Grace is the shutdown grace with its default applied.
func (b *Base) Grace() time.Duration {
	if b.ShutdownGrace == 0 {
		return DefaultShutdownGrace
	}
	return b.ShutdownGrace
}

// Configuration is a service's configuration struct.
type Configuration interface {
	ServiceBase() *Base
	Validate() error
}

// ConfigEnv names the environment variable that lists configuration files
// (comma-separated) when no -config flag is given.
const ConfigEnv = "JETFLEET_CONFIG"

// Flags are the command-line flags every service binary takes.
type Flags struct {
	Files       []string
	Sets        []string
	PrintConfig bool
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// ParseFlags reads -config FILE (repeatable), -set key=value (repeatable)
// and -print-config from args.
func ParseFlags(name string, args []string, stderr io.Writer) (Flags, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var files, sets listFlag
	fs.Var(&files, "config", "YAML configuration `file` (repeatable; later files win). Defaults to $"+ConfigEnv)
	fs.Var(&sets, "set", "override one configuration `key=value` (repeatable)")
	printConfig := fs.Bool("print-config", false, "print the effective configuration (secrets redacted) and exit")
	if err := fs.Parse(args); err != nil {
		return Flags{}, err
	}
	if fs.NArg() > 0 {
		return Flags{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if len(files) == 0 {
		if env := os.Getenv(ConfigEnv); env != "" {
			files = strings.Split(env, ",")
		}
	}
	return Flags{Files: files, Sets: sets, PrintConfig: *printConfig}, nil
}

// LoadConfig loads cfg (holding its defaults) from the files and overrides in flags.
func LoadConfig(cfg Configuration, flags Flags) error {
	_, err := config.Load(cfg, config.Options{Files: flags.Files, Sets: flags.Sets, IgnoreEnv: []string{ConfigEnv}})
	return err
}

// Env is what a service's components are built from: a logger, telemetry,
// and a connection to a provisioned JetStream.
type Env struct {
	Name      string
	Base      *Base
	Logger    *slog.Logger
	Telemetry *telemetry.Telemetry
	Conn      *nats.Conn
	JetStream jetstream.JetStream
}

// ComponentLogger is the environment's logger tagged with component (a
// logger that discards everything when the environment has none, as in
// some tests).
func (e *Env) ComponentLogger(component string) *slog.Logger {
	if e.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return e.Logger.With(telemetry.LogComponent, component)
}

// LeaseTTL is the topology's leader lease TTL (the default when the
// environment carries no base configuration, as in tests).
func (e *Env) LeaseTTL() time.Duration {
	if e.Base == nil {
		return topology.DefaultLeaseTTL
	}
	return e.Base.Topology.WithDefaults().LeaseTTL
}

// Connect opens a NATS connection for the component name and provisions the
// topology. Close releases the connection.
func Connect(ctx context.Context, name string, base *Base, tel *telemetry.Telemetry, logger *slog.Logger) (*Env, error) {
	nc, err := natsconn.Connect(base.NATS, name, logger)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	if err := base.Topology.CheckServer(nc.MaxPayload()); err != nil {
		nc.Close()
		return nil, err
	}
	if base.Topology.VerifyOnly {
		waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
		err = topology.Verify(waitCtx, js, base.Topology)
		cancel()
	} else {
		err = topology.Ensure(ctx, js, base.Topology)
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("provision JetStream: %w", err)
	}
	return &Env{Name: name, Base: base, Logger: logger, Telemetry: tel, Conn: nc, JetStream: js}, nil
}

// Close drains the connection: pending publishes are flushed first.
func (e *Env) Close() {
	if err := e.Conn.Drain(); err != nil {
		e.Conn.Close()
	}
}

// NATSReady is a readiness check that passes while nc is connected.
func NATSReady(nc *nats.Conn) telemetry.ReadyCheck {
	return func(context.Context) error {
		if !nc.IsConnected() {
			return fmt.Errorf("not connected (%s)", nc.Status())
		}
		return nil
	}
}

// BuildFunc builds a service's component from its environment. It may
// register readiness checks on http.
type BuildFunc func(ctx context.Context, env *Env, http *telemetry.HTTPServer) (lifecycle.Component, error)

// Main is the whole main function of a service binary.
func Main(name string, cfg Configuration, build BuildFunc) {
	if err := Run(context.Background(), name, os.Args[1:], cfg, build); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// Run parses args, loads cfg, starts the service and runs it until ctx ends
// or a signal arrives.
func Run(ctx context.Context, name string, args []string, cfg Configuration, build BuildFunc) error {
	flags, err := ParseFlags(name, args, os.Stderr)
	if err != nil {
		return err
	}
	if err := LoadConfig(cfg, flags); err != nil {
		return err
	}
	if flags.PrintConfig {
		return config.Print(os.Stdout, cfg)
	}
	base := cfg.ServiceBase()
	logger, err := telemetry.NewLogger(os.Stderr, base.Telemetry)
	if err != nil {
		return err
	}
	logger = logger.With("service", name)
	tel, err := telemetry.Setup(ctx, telemetry.Options{ServiceName: "jetfleet-" + name})
	if err != nil {
		return err
	}
	defer func() {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tel.Shutdown(shutdownCtx)
	}()
	env, err := Connect(ctx, name, base, tel, logger)
	if err != nil {
		return err
	}
	defer env.Close()

	var components []lifecycle.Component
	var http *telemetry.HTTPServer
	if base.Telemetry.HTTPAddr != "" {
		http = telemetry.NewHTTPServer(base.Telemetry.HTTPAddr, tel.Registry, logger)
		http.AddReadyCheck("nats", NATSReady(env.Conn))
		components = append(components, http)
	}
	component, err := build(ctx, env, http)
	if err != nil {
		return err
	}
	components = append(components, component)
	if http != nil {
		logger.Info("serving /metrics, /healthz and /readyz", "addr", base.Telemetry.HTTPAddr)
	}
	return lifecycle.Run(ctx, logger, base.Grace(), lifecycle.NewGroup(name, components...))
}
