package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/jetfleet/jetfleet/pkg/agent/agentservice"
	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/devfleet"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
)

func init() {
	register(command{name: "config", summary: "config print: show a service's effective configuration, secrets redacted", run: runConfig})
}

// serviceConfigs are the configurations `jetfleet config print` knows, by service.
var serviceConfigs = map[string]func() service.Configuration{
	"agent":      func() service.Configuration { return agentservice.DefaultServiceConfig() },
	"dev":        func() service.Configuration { return devfleet.DefaultConfig() },
	"scheduler":  func() service.Configuration { return scheduler.DefaultServiceConfig() },
	"supervisor": func() service.Configuration { return supervisor.DefaultServiceConfig() },
}

func runConfig(_ context.Context, args []string, out io.Writer) error {
	names := make([]string, 0, len(serviceConfigs))
	for name := range serviceConfigs {
		names = append(names, name)
	}
	sort.Strings(names)
	usage := fmt.Sprintf("usage: jetfleet config print <%s> [-config file]... [-set key=value]...", strings.Join(names, "|"))
	if len(args) < 2 || args[0] != "print" {
		fmt.Fprintln(os.Stderr, usage)
		return errUsage
	}
	newConfig, ok := serviceConfigs[args[1]]
	if !ok {
		fmt.Fprintln(os.Stderr, usage)
		return fmt.Errorf("unknown service %q", args[1])
	}
	flags, err := service.ParseFlags("jetfleet config print "+args[1], args[2:], os.Stderr)
	if err != nil {
		return err
	}
	cfg := newConfig()
	if err := service.LoadConfig(cfg, flags); err != nil {
		return err
	}
	if d, ok := cfg.(service.Defaulter); ok {
		d.ApplyDefaults()
	}
	return config.Print(out, cfg)
}
