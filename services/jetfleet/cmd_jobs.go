package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

func init() {
	register(&command{name: "jobs", summary: "running jobs, a job's status, execution history and cancels: jobs ls|get|history|cancel", subs: []*command{
		{name: "ls", summary: "List the jobs agents run now, from their heartbeats; with -state, the jobs in a state (queued, delayed, running, failed, succeeded, dead, cancelled).", fleet: true, output: true, setup: setupJobsList},
		{name: "get", args: "<job_id>", summary: "Print a job's status: its latest event, and where it runs now.",
			fleet: true, output: true, setup: setupJobsGet},
		{name: "history", args: "(-kind k [-queue q] | -schedule id)", summary: "Print the last executions of a job kind or a schedule, and their statistics.",
			fleet: true, output: true, setup: setupJobsHistory},
		{name: "cancel", args: "<job_id> | (-queue q | -kind k | -schedule id)",
			summary: "Cancel a job, or the jobs of a queue, kind or schedule, wherever they are.",
			help: "A running job's agent ends it; a queued or retrying job is removed; a job not found yet is ended\n" +
				"by the agent that receives it. The run ends cancelled: no dead letter, unless -dead-letter.",
			fleet: true, output: true, setup: setupJobsCancel},
		{name: "trends", args: "[-kind k [-queue q] | -schedule id]",
			summary: "Print the trend of a job kind or a schedule (runs, failures, p50/p95 duration, scheduling delay per minute or hour, degrading or not); without flags, every series' verdict.",
			fleet:   true, output: true, setup: setupJobsTrends},
	}})
}

func setupJobsCancel(fs *flag.FlagSet) action {
	var req jetfleet.CancelRequest
	fs.StringVar(&req.Queue, "queue", "", "the jobs of this `queue` (with a job id: where to look for it)")
	fs.StringVar(&req.Kind, "kind", "", "the jobs of this `kind` (with a job id: where to look for it)")
	fs.StringVar(&req.ScheduleID, "schedule", "", "the jobs of this schedule `id`")
	fs.StringVar(&req.Reason, "reason", "", "why, recorded as the job's error")
	fs.BoolVar(&req.DeadLetter, "dead-letter", false, "dead-letter the jobs (reason cancelled) instead")
	fs.IntVar(&req.Limit, "limit", 0, "most jobs a filter cancels (default 1000, at most 10000)")
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(0, "the <job_id>"); err != nil {
			return err
		}
		if len(inv.args) == 1 {
			req.JobID = inv.args[0]
		} else if req.Queue == "" && req.Kind == "" && req.ScheduleID == "" {
			return usageErrorf(inv.cmd, "jobs cancel needs a <job_id>, or -queue, -kind or -schedule")
		}
		req.RequestedBy = requester()
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
			res, err := api.CancelJobs(ctx, req)
			if err != nil {
				return err
			}
			if err := inv.print(res, func(out io.Writer) error { return printCancels(out, res) }); err != nil {
				return err
			}
			var failed int
			for _, r := range res.Results {
				if r.Error != "" {
					failed++
				}
			}
			if failed > 0 {
				return fmt.Errorf("%w: %d of %d jobs not cancelled", errRefused, failed, len(res.Results))
			}
			return nil
		})
	}
}

func printCancels(out io.Writer, res *jetfleet.CancelResponse) error {
	if len(res.Results) == 0 {
		_, err := fmt.Fprintln(out, "no job matched")
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB	WHERE	AGENT	ERROR")
	for _, r := range res.Results {
		where := r.Where
		if r.Error != "" {
			where = "not cancelled"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.JobID, dash(where), dash(r.AgentID), dash(r.Error))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if res.Truncated {
		_, err := fmt.Fprintln(out, "more jobs match: run it again")
		return err
	}
	return nil
}

// requester names who cancels: the user running the CLI.
func requester() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return "jetfleet CLI"
}

func setupJobsList(fs *flag.FlagSet) action {
	var req jetfleet.RunningJobsRequest
	fs.StringVar(&req.Queue, "queue", "", "only jobs of this `queue`")
	fs.StringVar(&req.Kind, "kind", "", "only jobs of this `kind`")
	fs.StringVar(&req.AgentID, "agent", "", "only jobs of this agent `id`")
	st := addStateFlags(fs)
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(0); err != nil {
			return err
		}
		if st.state != "" {
			return runJobsByState(ctx, inv, req, st)
		}
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
			res, err := api.RunningJobs(ctx, req)
			if err != nil {
				return err
			}
			return inv.print(res.Jobs, func(out io.Writer) error {
				if len(res.Jobs) == 0 {
					_, err := fmt.Fprintln(out, "no running jobs")
					return err
				}
				return printRunning(out, res.Jobs, time.Now())
			})
		})
	}
}

func printRunning(out io.Writer, jobs []jetfleet.RunningJob, now time.Time) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tQUEUE\tKIND\tAGENT\tATTEMPT\tDELIVERED\tRUNNING\tDEADLINE\tSTATE\tPROGRESS")
	for _, j := range jobs {
		running, deadline := "-", "-"
		if !j.StartedAt.IsZero() {
			running = now.Sub(j.StartedAt).Round(time.Millisecond).String()
		}
		if !j.Deadline.IsZero() {
			deadline = j.Deadline.UTC().Format(time.RFC3339)
		}
		progress := "-"
		if j.Progress != nil {
			progress = truncate(j.Progress.String(), 60)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", j.JobID, j.Queue, j.Kind, j.AgentID, j.Attempt, j.Delivered,
			running, deadline, j.State, progress)
	}
	return tw.Flush()
}

func setupJobsGet(fs *flag.FlagSet) action {
	var req jetfleet.JobDetailRequest
	fs.StringVar(&req.Queue, "queue", "", "the job's `queue`, with -kind (faster)")
	fs.StringVar(&req.Kind, "kind", "", "the job's `kind`, with -queue")
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(1, "the <job_id>"); err != nil {
			return err
		}
		req.JobID = inv.args[0]
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
			res, err := api.JobDetail(ctx, req)
			if err != nil {
				return err
			}
			return inv.print(res, func(out io.Writer) error { return printJobDetail(out, res) })
		})
	}
}

// maxResultShown is how much of a job's result jobs get prints in a table.
const maxResultShown = 500

// printJobDetail prints a job's latest event and where it runs, one field a line.
func printJobDetail(out io.Writer, res *jetfleet.JobDetail) error {
	ev, err := res.Decode()
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "JOB\t%s\n", res.JobID)
	if d := res.Delayed; d != nil {
		fmt.Fprintf(tw, "DELAYED\tuntil %s (in %s), queue %s, kind %s\n", d.ProcessAt.UTC().Format(time.RFC3339),
			time.Until(d.ProcessAt).Round(time.Second), d.Queue, d.Kind)
	}
	if ev == nil && res.Delayed != nil {
		return tw.Flush()
	}
	if ev == nil {
		fmt.Fprintln(tw, "STATE\t- (no event yet: queued, or no such job)")
	} else {
		state := ev.GetType()
		if state == protocol.EventProgress {
			state = jetfleet.StateRunning
		}
		fmt.Fprintf(tw, "STATE\t%s\n", state)
		fmt.Fprintf(tw, "QUEUE\t%s\n", ev.GetQueue())
		fmt.Fprintf(tw, "KIND\t%s\n", ev.GetKind())
		fmt.Fprintf(tw, "ATTEMPT\t%d of %d\n", ev.GetAttempt(), ev.GetMaxAttempts())
		fmt.Fprintf(tw, "AGENT\t%s\n", dash(ev.GetAgentId()))
		fmt.Fprintf(tw, "TIME\t%s\n", ev.GetTime().AsTime().UTC().Format(time.RFC3339Nano))
		if ev.GetDuration() != nil {
			fmt.Fprintf(tw, "DURATION\t%s\n", ev.GetDuration().AsDuration())
		}
		if ev.GetRetryIn() != nil {
			fmt.Fprintf(tw, "RETRY IN\t%s\n", ev.GetRetryIn().AsDuration())
		}
		for _, f := range [][2]string{{"REASON", ev.GetReason()}, {"ERROR CODE", ev.GetErrorCode()}, {"ERROR", firstLine(ev.GetError())},
			{"SCHEDULE", ev.GetScheduleId()}, {"TRACE", ev.GetTraceId()}} {
			if f[1] != "" {
				fmt.Fprintf(tw, "%s\t%s\n", f[0], f[1])
			}
		}
	}
	if p := res.Progress; p != nil {
		fmt.Fprintf(tw, "PROGRESS\t%s (reported %s)\n", p, p.Time.UTC().Format(time.RFC3339))
	}
	if r := res.Result; len(r) > 0 {
		text := string(r)
		if len(text) > maxResultShown {
			text = fmt.Sprintf("%s… (%d bytes; -o json shows all)", strings.ToValidUTF8(text[:maxResultShown], ""), len(r))
		}
		fmt.Fprintf(tw, "RESULT\t%s\n", text)
	}
	for _, r := range res.Running {
		fmt.Fprintf(tw, "RUNNING ON\t%s (attempt %d, delivery %d, %s)\n", r.AgentID, r.Attempt, r.Delivered, r.State)
	}
	return tw.Flush()
}

func setupJobsHistory(fs *flag.FlagSet) action {
	var req jetfleet.HistoryRequest
	fs.StringVar(&req.Kind, "kind", "", "executions of this job `kind`")
	fs.StringVar(&req.Queue, "queue", "", "only in this `queue` (with -kind; default every queue)")
	fs.StringVar(&req.ScheduleID, "schedule", "", "executions of this schedule `id`")
	fs.IntVar(&req.Limit, "limit", 0, "most executions (default supervisor.history_size)")
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(0); err != nil {
			return err
		}
		if (req.Kind == "") == (req.ScheduleID == "") {
			return usageErrorf(inv.cmd, "jobs history needs -kind or -schedule (one of them)")
		}
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
			res, err := api.History(ctx, req)
			if err != nil {
				return err
			}
			return inv.print(historyResponseJSON(res), func(out io.Writer) error { return printHistory(out, res) })
		})
	}
}

func printHistory(out io.Writer, res *jetfleet.HistoryResponse) error {
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
