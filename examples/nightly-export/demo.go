package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/agent/agentservice"
	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/service"
)

// DemoConfig configures RunDemo, the example in one command (-demo).
type DemoConfig struct {
	// URL is the fleet's NATS server (go tool task dev: nats://127.0.0.1:4222).
	URL string
	// Dir is the agents' directory (Config.Dir): in/ gets the sample files,
	// out/<run>/ the exports and the report.
	Dir string
	// ExampleDir holds workflow.json, schedule.json, agent.yaml and
	// export-file.sh, the files the manual way (README.md) uses. Defaults to
	// examples/nightly-export: run from the repository root.
	ExampleDir string
	// AgentID is the Go agent's id; the exec agent's is agent.yaml's.
	AgentID string
	// Backoff replaces workflow.json's 30 s between a file's attempts.
	// Defaults to DefaultDemoBackoff.
	Backoff time.Duration
}

// DefaultDemoBackoff is the demo's delay between a file's attempts: the run
// ends about 5 s after it starts instead of a minute.
const DefaultDemoBackoff = 2 * time.Second

// withDefaults fills in the defaults and makes the paths absolute (the exec
// handler runs only an absolute path, and the shell program gets Dir).
func (c DemoConfig) withDefaults() (DemoConfig, error) {
	if c.ExampleDir == "" {
		c.ExampleDir = filepath.Join("examples", "nightly-export")
	}
	if c.Backoff == 0 {
		c.Backoff = DefaultDemoBackoff
	}
	if c.AgentID == "" {
		c.AgentID = "nightly-export-go"
	}
	switch {
	case c.URL == "":
		return c, errors.New("demo: a NATS server url is required")
	case c.Dir == "":
		return c, errors.New("demo: a directory is required")
	case c.Backoff < 0:
		return c, fmt.Errorf("demo: -backoff %s is negative", c.Backoff)
	}
	var err error
	if c.Dir, err = filepath.Abs(c.Dir); err != nil {
		return c, err
	}
	if c.ExampleDir, err = filepath.Abs(c.ExampleDir); err != nil {
		return c, err
	}
	if _, err := os.Stat(filepath.Join(c.ExampleDir, "export-file.sh")); err != nil {
		return c, fmt.Errorf("demo: %w: run from the repository root, or give -example-dir", err)
	}
	return c, nil
}

// RunDemo runs the whole example once against the fleet at cfg.URL and
// prints to out which files failed and where that list is stored. It writes
// the sample files to Dir/in (refunds.csv corrupt, even if it was fixed),
// starts the Go agent and the exec agent that runs export-file.sh (both in
// this process, until RunDemo returns), stores the workflow with the
// demo's backoff and the 02:00 Europe/Berlin schedule, fires the schedule
// now as 02:00 would, and waits for the run's end (at most 2 minutes plus
// three backoffs).
//
// A run that ends failed because a file failed is the demo working as
// designed: RunDemo returns nil for a run that succeeded or failed, and an
// error when it could not run the demo or the run was cancelled.
func RunDemo(ctx context.Context, cfg DemoConfig, out io.Writer, logger *slog.Logger) (err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return err
	}
	def, err := os.ReadFile(filepath.Join(cfg.ExampleDir, "workflow.json"))
	if err != nil {
		return err
	}
	doc, err := os.ReadFile(filepath.Join(cfg.ExampleDir, "schedule.json"))
	if err != nil {
		return err
	}
	sched, err := jetfleet.DecodeSchedule(doc)
	if err != nil {
		return fmt.Errorf("schedule.json: %w", err)
	}
	if err := ResetSamples(cfg.Dir); err != nil {
		return fmt.Errorf("writing the sample files: %w", err)
	}
	fmt.Fprintf(out, "wrote the sample files to %s (refunds.csv is corrupt)\n", filepath.Join(cfg.Dir, "in"))

	nc, err := nats.Connect(cfg.URL, nats.Name("nightly-export-demo"))
	if err != nil {
		return fmt.Errorf("connect to %s (is the dev fleet running? go tool task dev): %w", cfg.URL, err)
	}
	defer nc.Close()
	stopAgents, err := startDemoAgents(ctx, nc, cfg, logger)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopAgents()) }()
	fmt.Fprintf(out, "agents running: %s (list-files, export-report; queue %s), nightly-export-exec (export-file.sh; queue export-files)\n",
		cfg.AgentID, Queue)

	client := jetfleet.NewClient(nc)
	wf, err := demoWorkflow(def, cfg.Backoff)
	if err != nil {
		return err
	}
	if _, err := client.AddWorkflow(ctx, wf); err != nil {
		return fmt.Errorf("storing the workflow: %w", err)
	}
	fmt.Fprintf(out, "stored workflow %s: %d steps; a file's attempts %s apart (workflow.json says 30s)\n",
		wf.Name, len(wf.Steps), cfg.Backoff)
	stored, err := client.AddSchedule(ctx, sched)
	if errors.Is(err, protocol.Code(protocol.CodeAlreadyExists)) {
		stored, err = client.UpdateSchedule(ctx, sched, 0) // an earlier demo's, or schedule.json stored by hand
	}
	if err != nil {
		return fmt.Errorf("storing the schedule: %w", err)
	}
	next := "-"
	if len(stored.NextFires) > 0 {
		next = stored.NextFires[0].Format(time.RFC3339)
		if loc, err := time.LoadLocation(sched.Spec.Zone); err == nil {
			next = stored.NextFires[0].In(loc).Format(time.RFC3339)
		}
	}
	fmt.Fprintf(out, "stored schedule %s: cron %q in %s, next fire %s\n", sched.ID, sched.Spec.Cron, sched.Spec.Zone, next)

	fired, err := client.TriggerSchedule(ctx, sched.ID)
	if err != nil {
		return fmt.Errorf("firing the schedule: %w", err)
	}
	if fired.Outcome != "fired" {
		return fmt.Errorf("schedule %s was not fired (%s: %s): a run of it may still be going on; see 'go run ./services/jetfleet workflow runs'",
			sched.ID, fired.Outcome, fired.Reason)
	}
	fmt.Fprintf(out, "fired schedule %s now, as 02:00 would: job %s; waiting for its run to end…\n", sched.ID, fired.JobID)

	run, err := waitFiredRun(ctx, client, wf.Name, fired.JobID, 2*time.Minute+3*cfg.Backoff)
	if err != nil {
		return err
	}
	if err := printDemoRun(ctx, out, client, run, cfg.Dir); err != nil {
		return err
	}
	if run.Status == jetfleet.WorkflowCancelled {
		return fmt.Errorf("run %s was cancelled", run.RunID)
	}
	return nil
}

// startDemoAgents starts the Go agent on nc and the exec agent, built from
// agent.yaml as the agent binary builds it, on a connection of its own. The
// returned func stops both within 30 s.
func startDemoAgents(ctx context.Context, nc *nats.Conn, cfg DemoConfig, logger *slog.Logger) (stop func() error, err error) {
	goAgent, err := NewAgent(nc, Config{Dir: cfg.Dir, AgentID: cfg.AgentID}, logger.With("agent", cfg.AgentID))
	if err != nil {
		return nil, err
	}
	// go run ./services/agent -config examples/nightly-export/agent.yaml -set …
	agentCfg := agentservice.DefaultServiceConfig()
	if _, err := config.Load(agentCfg, config.Options{
		Files: []string{filepath.Join(cfg.ExampleDir, "agent.yaml")},
		Sets: []string{"nats.url=" + cfg.URL, "telemetry.http_addr=",
			"handlers.export-file.command=" + filepath.Join(cfg.ExampleDir, "export-file.sh"),
			"handlers.export-file.env.NIGHTLY_EXPORT_DIR=" + cfg.Dir},
		Environ: []string{},
	}); err != nil {
		return nil, err
	}
	execConn, err := nats.Connect(cfg.URL, nats.Name(agentCfg.Agent.ID))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", cfg.URL, err)
	}
	execLogger := logger.With("agent", agentCfg.Agent.ID)
	execAgent, err := agentservice.New(agentCfg, &service.Env{Name: "agent", Base: &agentCfg.Base, Logger: execLogger, Conn: execConn})
	if err != nil {
		execConn.Close()
		return nil, err
	}
	stop = func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		err := errors.Join(goAgent.Stop(sctx), execAgent.Stop(sctx))
		execConn.Close()
		return err
	}
	if err := goAgent.Start(ctx); err != nil {
		return nil, errors.Join(err, stop()) // stops what is not started, and closes the exec handler
	}
	if err := execAgent.Start(ctx); err != nil {
		return nil, errors.Join(err, stop())
	}
	return stop, nil
}

// demoWorkflow is workflow.json with every step's backoff replaced by
// backoff.
func demoWorkflow(doc []byte, backoff time.Duration) (*protocol.WorkflowDefinition, error) {
	def, err := protocol.ParseWorkflowDefinition(doc)
	if err != nil {
		return nil, fmt.Errorf("workflow.json: %w", err)
	}
	for i := range def.Steps {
		if len(def.Steps[i].Backoff) > 0 {
			def.Steps[i].Backoff = []string{backoff.String()}
		}
	}
	return def, nil
}

// waitFiredRun waits, at most bound, for the end of the run of workflow
// that the schedule's fired job jobID started, and returns it. The job's state
// follows the run's (docs/protocol.md §8.2): it is over when the run is.
func waitFiredRun(ctx context.Context, client *jetfleet.Client, workflow, jobID string, bound time.Duration) (*jetfleet.WorkflowRunDetail, error) {
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var failed *jetfleet.JobFailedError
	if _, err := client.Wait(wctx, jobID); err != nil && !errors.As(err, &failed) {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, fmt.Errorf("the run of job %s did not end within %s: is the fleet's supervisor running? see 'go run ./services/jetfleet workflow runs'", jobID, bound)
		}
		return nil, err
	}
	// The run is listed from its start; the leader reports its end (the
	// job's among it) before it stores the ended run (docs/workflows.md),
	// so WaitWorkflowRun waits for that. The listing is read again only if
	// the run is missing from it, which a fleet in order does not show.
	for {
		runs, err := client.WorkflowRuns(wctx, jetfleet.WorkflowRunsRequest{Workflow: workflow, Limit: jetfleet.MaxWorkflowRunsLimit})
		if err != nil {
			return nil, err
		}
		for _, r := range runs {
			if r.JobID == jobID {
				return client.WaitWorkflowRun(wctx, r.RunID)
			}
		}
		select {
		case <-wctx.Done():
			return nil, fmt.Errorf("job %s is over but no run of workflow %s stands for it", jobID, workflow)
		case <-time.After(100 * time.Millisecond): // the listing has no change feed to wait on
		}
	}
}

// printDemoRun prints the run's outcome, each failed file with its error
// and the last line of its output, and where the list is stored.
func printDemoRun(ctx context.Context, out io.Writer, client *jetfleet.Client, run *jetfleet.WorkflowRunDetail, dir string) error {
	took := ""
	if run.EndedAt != nil {
		took = fmt.Sprintf(" after %s", run.EndedAt.Sub(run.StartedAt).Round(100*time.Millisecond))
	}
	fmt.Fprintf(out, "\nrun %s of workflow %s: %s%s\n", run.RunID, run.Workflow, run.Status, took)
	if run.Error != "" {
		fmt.Fprintf(out, "  %s\n", run.Error)
	}
	for _, st := range run.Steps {
		if st.Elements == nil {
			continue
		}
		total := 0
		for _, n := range st.Elements {
			total += n
		}
		fmt.Fprintf(out, "  step %s: %d of %d files exported, %d failed\n", st.Name, st.Elements[jetfleet.WorkflowSucceeded], total,
			st.Elements[jetfleet.WorkflowFailed]+st.Elements[jetfleet.WorkflowCancelled])
	}

	if len(run.Failures.Elements)+len(run.Failures.Steps) == 0 {
		fmt.Fprintln(out, "\nno file failed")
	} else {
		fmt.Fprintln(out, "\nFAILED FILES")
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		for _, f := range run.Failures.Elements {
			var name string
			if json.Unmarshal(f.Item, &name) != nil {
				name = string(f.Item)
			}
			fmt.Fprintf(tw, "%s\terror:\t%s\n", name, f.Error)
			if line := lastOutputLine(ctx, client, f.JobID); line != "" {
				fmt.Fprintf(tw, "\toutput:\t%s\n", line)
			}
			fmt.Fprintf(tw, "\tjob:\t%s\n", f.JobID)
		}
		for _, f := range run.Failures.Steps {
			fmt.Fprintf(tw, "step %s\terror:\t%s\n", f.Step, f.Error)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	fmt.Fprintf(out, "\nWHERE THE LIST IS STORED\n"+
		"the run, its failed files included, is key %s in bucket %s\n"+
		"(kept topology.workflow_run_ttl, 720h by default, after its last change):\n", run.RunID, protocol.BucketWorkflowRuns)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  go run ./services/jetfleet workflow get %s\t# the run: its steps and failed files\n", run.RunID)
	fmt.Fprintf(tw, "  go run ./services/jetfleet workflow retry-failed %s\t# after fixing the files: export only those again\n", run.RunID)
	fmt.Fprintf(tw, "  go run ./services/jetfleet jobs get <job>\t# a failed file's job: its attempts and output\n")
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(out, "the report step's list of exported and failed files: %s\n", filepath.Join(dir, "out", run.RunID, "report.txt"))
	return err
}

// lastOutputLine is the last non-empty line of the job's output tail (the
// shell program's reason), or "" when there is none.
func lastOutputLine(ctx context.Context, client *jetfleet.Client, jobID string) string {
	job, err := client.Job(ctx, jobID)
	if err != nil || job.Event == nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(job.Event.GetOutputTail()), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
