package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/jetfleet/jetfleet/pkg/bench"
)

func init() {
	register(command{name: "bench", summary: "measure the fleet against raw JetStream in the same run", run: runBench})
}

func runBench(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("bench", "",
		"Measure jetfleet against a raw JetStream baseline in the same run: throughput, latency,\n"+
			"schedules, rescue, failover and durability (docs/performance.md says what each figure means).\n"+
			"Every run uses a fresh embedded server unless -server is given.")
	// With -smoke, every size defaults to the smoke's, and flags given override it.
	cfg := bench.Config{}
	if smokeRequested(args) {
		cfg = bench.Smoke()
	}
	def := cfg.WithDefaults()
	scenario := fs.String("scenario", "all", "scenarios to run, comma-separated: all or "+strings.Join(bench.Scenarios, ","))
	fs.Bool("smoke", false, "a quick check that every scenario works (tiny sizes, one run): for CI, not for figures")
	format := fs.String("o", "table", "output format: table or json")
	fs.StringVar(&cfg.Server, "server", "", "NATS server `url` to run against instead of an embedded server (never $NATS_URL)")
	fs.StringVar(&cfg.NATS.CredsFile, "creds", os.Getenv("NATS_CREDS"), "user credentials `file` for -server (or $NATS_CREDS)")
	fs.StringVar(&cfg.NATS.User, "user", os.Getenv("NATS_USER"), "user `name` for -server (or $NATS_USER; password in $NATS_PASSWORD)")
	cfg.NATS.Password = os.Getenv("NATS_PASSWORD")
	fs.IntVar(&cfg.Runs, "runs", def.Runs, "runs of each scenario; figures show min/median/max over them")
	fs.IntVar(&cfg.Jobs, "jobs", def.Jobs, "throughput: no-op jobs per phase (N)")
	fs.IntVar(&cfg.Agents, "agents", def.Agents, "throughput, latency: agents, each on its own connection (K); the raw baseline runs as many consumers")
	fs.IntVar(&cfg.Concurrency, "concurrency", def.Concurrency, "throughput, latency: concurrency of each agent, and messages in flight per raw consumer (C)")
	fs.IntVar(&cfg.PayloadSize, "payload-size", def.PayloadSize, "bytes of each job's JSON payload")
	fs.IntVar(&cfg.Rate, "rate", def.Rate, "latency: offered load in jobs per second")
	fs.DurationVar(&cfg.Duration, "duration", def.Duration, "latency: how long the load is offered")
	fs.IntVar(&cfg.Schedules, "schedules", def.Schedules, "schedules: one-shot schedules due in the same second (S)")
	fs.DurationVar(&cfg.ScheduleLead, "schedule-lead", def.ScheduleLead, "schedules: how long before their due second the schedules are written")
	fs.IntVar(&cfg.IdleSchedules, "idle-schedules", def.IdleSchedules, "schedules: idle schedules loaded to measure heap per schedule")
	fs.IntVar(&cfg.RescueJobs, "rescue-jobs", def.RescueJobs, "rescue: jobs the killed agent holds")
	fs.IntVar(&cfg.Replicas, "replicas", def.Replicas, "failover: scheduler replicas")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", def.LeaseTTL, "failover: leader lease TTL (topology.lease_ttl)")
	fs.IntVar(&cfg.DurabilityJobs, "durability-jobs", cfg.DurabilityJobs, "durability: jobs per phase (0: as many as -jobs)")
	verbose := fs.Bool("v", false, "log the components' warnings and errors to stderr")
	quiet := fs.Bool("q", false, "no progress lines on stderr")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole bench to `file` (go tool pprof)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return errUsage
	}
	if *format != "table" && *format != "json" {
		return fmt.Errorf("-o %q: want table or json", *format)
	}
	cfg.Scenarios = strings.Split(*scenario, ",")
	if *verbose {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if !*quiet {
		cfg.Progress = os.Stderr
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer func() {
			if cerr := f.Close(); cerr != nil {
				fmt.Fprintf(os.Stderr, "jetfleet bench: writing the CPU profile %s: %v\n", *cpuProfile, cerr)
			}
		}()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	report, err := bench.Run(ctx, cfg)
	if err != nil {
		if report != nil && len(report.Figures) > 0 {
			fmt.Fprintln(os.Stderr, "jetfleet bench: figures measured before the failure:")
			_ = report.WriteTable(os.Stderr)
		}
		return err
	}
	if *format == "json" {
		return report.WriteJSON(out)
	}
	return report.WriteTable(out)
}

// smokeRequested reports whether args ask for -smoke, before the flags are
// parsed, so that the smoke's sizes become the defaults.
func smokeRequested(args []string) bool {
	smoke := false
	for _, a := range args {
		if a == "--" {
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "smoke" {
			continue
		}
		smoke = true
		if hasValue {
			smoke, _ = strconv.ParseBool(value)
		}
	}
	return smoke
}
