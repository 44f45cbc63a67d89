package main

import (
	"context"
	"flag"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/jetfleet/jetfleet/pkg/agent/agentservice"
	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/devfleet"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
)

func init() {
	register(&command{name: "config", summary: "config print: show a service's effective configuration, secrets redacted", subs: []*command{
		{name: "print", args: "<" + strings.Join(serviceNames(), "|") + ">",
			summary: "Print a service's effective configuration: defaults, files and -set overrides, secrets redacted.",
			setup:   setupConfigPrint},
	}})
}

// serviceConfigs are the configurations `jetfleet config print` knows, by service.
var serviceConfigs = map[string]func() service.Configuration{
	"agent":      func() service.Configuration { return agentservice.DefaultServiceConfig() },
	"dev":        func() service.Configuration { return devfleet.DefaultConfig() },
	"scheduler":  func() service.Configuration { return scheduler.DefaultServiceConfig() },
	"supervisor": func() service.Configuration { return supervisor.DefaultServiceConfig() },
}

func serviceNames() []string { return slices.Sorted(maps.Keys(serviceConfigs)) }

// serviceConfigFlags are the configuration flags of every jetfleet service
// (service.ParseFlags), for dev and config print.
type serviceConfigFlags struct {
	files, sets listFlag
	print       bool
}

func addServiceConfigFlags(fs *flag.FlagSet, withPrint bool) *serviceConfigFlags {
	f := &serviceConfigFlags{}
	fs.Var(&f.files, "config", "YAML configuration `file` (repeatable; later files win); default $"+service.ConfigEnv)
	fs.Var(&f.sets, "set", "override one configuration `key=value` (repeatable)")
	if withPrint {
		fs.BoolVar(&f.print, "print-config", false, "print the effective configuration (secrets redacted) and exit")
	}
	return f
}

func (f *serviceConfigFlags) flags() service.Flags {
	files := []string(f.files)
	if env := os.Getenv(service.ConfigEnv); len(files) == 0 && env != "" {
		files = strings.Split(env, ",")
	}
	return service.Flags{Files: files, Sets: f.sets, PrintConfig: f.print}
}

func setupConfigPrint(fs *flag.FlagSet) action {
	cf := addServiceConfigFlags(fs, false)
	return func(_ context.Context, inv *invocation) error {
		if err := inv.wantArgs(1, "the <service> ("+orList(serviceNames())+")"); err != nil {
			return err
		}
		newConfig, ok := serviceConfigs[inv.args[0]]
		if !ok {
			return usageErrorf(inv.cmd, "config print: unknown service %q: want %s", inv.args[0], orList(serviceNames()))
		}
		cfg := newConfig()
		if err := service.LoadConfig(cfg, cf.flags()); err != nil {
			return err
		}
		if d, ok := cfg.(service.Defaulter); ok {
			d.ApplyDefaults()
		}
		return config.Print(inv.out, cfg)
	}
}
