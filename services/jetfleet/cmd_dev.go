package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/devfleet"
	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

func init() {
	register(&command{name: "dev", summary: "run the whole fleet in one process on an embedded NATS server",
		help: "Runs an embedded NATS server, the scheduler, the supervisor and an agent with the demo kinds (echo,\n" +
			"sleep, fail) until interrupted. 'jetfleet config print dev' shows the configuration keys.",
		setup: setupDev})
}

func setupDev(fs *flag.FlagSet) action {
	cf := addServiceConfigFlags(fs, true)
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(0); err != nil {
			return err
		}
		flags := cf.flags()
		cfg := devfleet.DefaultConfig()
		if err := service.LoadConfig(cfg, flags); err != nil {
			return err
		}
		if flags.PrintConfig {
			shown := *cfg
			shown.ApplyDefaults()
			return config.Print(inv.out, &shown)
		}
		logger, err := telemetry.NewLogger(os.Stderr, cfg.Telemetry)
		if err != nil {
			return err
		}
		fleet, err := devfleet.New(cfg, devfleet.Options{Logger: logger})
		if err != nil {
			return err
		}
		return lifecycle.Run(ctx, logger, cfg.Grace(), announce{fleet, inv.out})
	}
}

// announce prints where everything is once the fleet has started.
type announce struct {
	*devfleet.Fleet
	out io.Writer
}

func (a announce) Start(ctx context.Context) error {
	start := time.Now()
	if err := a.Fleet.Start(ctx); err != nil {
		return err
	}
	a.Summary(a.out)
	fmt.Fprintf(a.out, "(started in %s)\n", time.Since(start).Round(time.Millisecond))
	return nil
}
