// Command nightly-export is the Go agent of the nightly export example
// (README.md): it runs the workflow's first and last steps, list-files and
// export-report, on queue export. The step between them, export-file, is a
// shell program that the jetfleet agent binary runs (export-file.sh,
// agent.yaml): a workflow's steps may be written in any language.
//
//	go run ./examples/nightly-export -dir /tmp/nightly-export [-samples]
//
// It connects to -server ($NATS_URL, default nats://127.0.0.1:4222) and runs
// until SIGINT or SIGTERM, then hands back what it runs.
//
// With -demo it runs the whole example once instead (RunDemo): the sample
// files, both agents in this process (export-file.sh through the exec
// handler), the workflow with -backoff between a file's attempts (default
// 2s) and its 02:00 schedule stored, the schedule fired now; then it prints
// the run's outcome, the failed files and where their list is stored, and
// exits. Run it from the repository root (or give -example-dir):
//
//	go run ./examples/nightly-export -demo [-backoff 2s]
//
// Its exit status is 0 when the run ended, failed files or not (a failed
// file is what the demo shows), and 1 when the demo could not run or the
// run was cancelled.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

func main() {
	server := flag.String("server", "", "NATS server `url` ($NATS_URL; default "+nats.DefaultURL+")")
	dir := flag.String("dir", "/tmp/nightly-export", "`directory` whose in/ holds the files to export and out/ the exports and reports")
	id := flag.String("id", "nightly-export-go", "agent `id`, unique in the fleet")
	samples := flag.Bool("samples", false, "first write the sample files missing from in/ (refunds.csv is corrupt)")
	demo := flag.Bool("demo", false, "run the whole example once against the fleet, print the failed files and where they are stored, and exit")
	backoff := flag.Duration("backoff", DefaultDemoBackoff, "with -demo, the `delay` between a file's attempts (workflow.json: 30s)")
	exampleDir := flag.String("example-dir", filepath.Join("examples", "nightly-export"),
		"with -demo, the `directory` of workflow.json, schedule.json, agent.yaml and export-file.sh")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "nightly-export: unexpected argument %q\n", flag.Arg(0))
		os.Exit(2)
	}
	if !*demo {
		// Flags of the demo alone: silently ignored, they would mislead.
		var misplaced []string
		flag.Visit(func(f *flag.Flag) {
			if f.Name == "backoff" || f.Name == "example-dir" {
				misplaced = append(misplaced, "-"+f.Name)
			}
		})
		if len(misplaced) > 0 {
			fmt.Fprintf(os.Stderr, "nightly-export: %s only with -demo\n", strings.Join(misplaced, " and "))
			os.Exit(2)
		}
	}
	url := *server
	if url == "" {
		url = os.Getenv("NATS_URL")
	}
	if url == "" {
		url = nats.DefaultURL
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if *demo {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		// The demo's output is what it prints; the agents say only what went wrong.
		quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		err := RunDemo(ctx, DemoConfig{URL: url, Dir: *dir, ExampleDir: *exampleDir, AgentID: *id, Backoff: *backoff}, os.Stdout, quiet)
		if err != nil {
			logger.Error("nightly-export demo failed", "error", err)
			stop()
			os.Exit(1)
		}
		return
	}
	if *samples {
		if err := WriteSamples(*dir); err != nil {
			logger.Error("writing the sample files", "error", err)
			os.Exit(1)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, url, Config{Dir: *dir, AgentID: *id}, logger); err != nil {
		logger.Error("nightly-export agent failed", "error", err)
		os.Exit(1)
	}
}

// run connects, starts the agent and runs it until ctx ends; then it stops
// the agent within 30 s.
func run(ctx context.Context, url string, cfg Config, logger *slog.Logger) error {
	nc, err := nats.Connect(url, nats.Name("nightly-export"))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", url, err)
	}
	defer nc.Close()
	a, err := NewAgent(nc, cfg, logger)
	if err != nil {
		return err
	}
	if err := a.Start(ctx); err != nil {
		return err
	}
	logger.Info("nightly-export agent running", "server", url, "queue", Queue, "kinds", a.Kinds(), "dir", cfg.Dir)
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return a.Stop(stopCtx)
}
