package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

func init() {
	register(command{name: "jobs", summary: "running jobs, a job's status and execution history: jobs ls|get|history", run: runJobs})
}

var jobsCommands = map[string]subcommand{
	"ls":      {"[-state s] [-queue q] [-kind k] [-agent id] [-schedule id] [-since t] [-until t]", "List the jobs agents run now, from their heartbeats; with -state, the jobs in a state (queued, delayed, running, failed, succeeded, dead).", runJobsList},
	"get":     {"[-queue q -kind k] <job id>", "Print a job's status: its latest event, and where it runs now.", runJobsGet},
	"history": {"-kind k [-queue q] | -schedule id", "Print the last executions of a job kind or a schedule, and their statistics.", runJobsHistory},
}

func runJobs(ctx context.Context, args []string, out io.Writer) error {
	return runSubcommand(ctx, "jobs", []string{"ls", "get", "history", "trends"}, jobsCommands, args, out)
}

func runJobsList(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	var req jetfleet.RunningJobsRequest
	fs.StringVar(&req.Queue, "queue", "", "only jobs of this `queue`")
	fs.StringVar(&req.Kind, "kind", "", "only jobs of this `kind`")
	fs.StringVar(&req.AgentID, "agent", "", "only jobs of this agent `id`")
	asJSON := fs.Bool("json", false, "print JSON")
	st := addStateFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		fs.Usage()
		return errUsage
	}
	if st.state != "" {
		return runJobsByState(ctx, cf, req, st, *asJSON, out)
	}
	c, api, err := connectSupervisor(cf)
	if err != nil {
		return err
	}
	defer c.close()
	rctx, cancel := c.ctx(ctx)
	defer cancel()
	res, err := api.RunningJobs(rctx, req)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(out, res.Jobs)
	}
	if len(res.Jobs) == 0 {
		fmt.Fprintln(out, "no running jobs")
		return nil
	}
	return printRunning(out, res.Jobs, time.Now())
}

func printRunning(out io.Writer, jobs []jetfleet.RunningJob, now time.Time) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tQUEUE\tKIND\tAGENT\tATTEMPT\tDELIVERED\tRUNNING\tDEADLINE\tSTATE")
	for _, j := range jobs {
		running, deadline := "-", "-"
		if !j.StartedAt.IsZero() {
			running = now.Sub(j.StartedAt).Round(time.Millisecond).String()
		}
		if !j.Deadline.IsZero() {
			deadline = j.Deadline.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", j.JobID, j.Queue, j.Kind, j.AgentID, j.Attempt, j.Delivered,
			running, deadline, j.State)
	}
	return tw.Flush()
}

func runJobsGet(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	var req jetfleet.JobDetailRequest
	fs.StringVar(&req.Queue, "queue", "", "the job's `queue`, with -kind (faster)")
	fs.StringVar(&req.Kind, "kind", "", "the job's `kind`, with -queue")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errUsage
	}
	req.JobID = fs.Arg(0)
	c, api, err := connectSupervisor(cf)
	if err != nil {
		return err
	}
	defer c.close()
	rctx, cancel := c.ctx(ctx)
	defer cancel()
	res, err := api.JobDetail(rctx, req)
	if err != nil {
		return err
	}
	return printJSON(out, res)
}

func runJobsHistory(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	var req jetfleet.HistoryRequest
	fs.StringVar(&req.Kind, "kind", "", "executions of this job `kind`")
	fs.StringVar(&req.Queue, "queue", "", "only in this `queue` (with -kind; default every queue)")
	fs.StringVar(&req.ScheduleID, "schedule", "", "executions of this schedule `id`")
	fs.IntVar(&req.Limit, "limit", 0, "most executions (default supervisor.history_size)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 || (req.Kind == "") == (req.ScheduleID == "") {
		fs.Usage()
		return errUsage
	}
	c, api, err := connectSupervisor(cf)
	if err != nil {
		return err
	}
	defer c.close()
	rctx, cancel := c.ctx(ctx)
	defer cancel()
	res, err := api.History(rctx, req)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(out, res)
	}
	recs, err := res.Decode()
	if err != nil {
		return err
	}
	st := res.Stats
	fmt.Fprintf(out, "%d executions: %d succeeded, %d dead (success rate %.1f%%); duration p50 %s, p95 %s",
		st.Executions, st.Succeeded, st.Dead, 100*st.SuccessRate, st.P50, st.P95)
	if st.ConsecutiveFailures > 0 {
		fmt.Fprintf(out, "; the last %d failed", st.ConsecutiveFailures)
	}
	fmt.Fprintln(out)
	if len(recs) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FINISHED\tJOB\tSTATUS\tATTEMPTS\tDURATION\tAGENT\tTRACE\tERROR")
	for _, r := range recs {
		status := r.GetStatus()
		if status == protocol.EventDead && r.GetReason() != "" {
			status += " (" + r.GetReason() + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r.GetFinishedAt().AsTime().UTC().Format(time.RFC3339), r.GetJobId(), status,
			r.GetAttempts(), r.GetDuration().AsDuration().Round(time.Microsecond), dash(r.GetAgentId()), dash(r.GetTraceId()),
			truncate(firstLine(r.GetError()), 60))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func firstLine(s string) string {
	for i, r := range s {
		if r == '\n' {
			return s[:i]
		}
	}
	return s
}
