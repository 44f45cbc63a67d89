package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// jetfleet jobs ls -state …: the jobs in a state (the supervisor's
// jetfleet.api.supervisor.jobs.ls), and jetfleet jobs trends: a kind's or
// schedule's trend buckets and verdict.

type stateFlags struct {
	state, schedule, since, until string
	limit                         int
	cursor                        uint64
}

func addStateFlags(fs *flag.FlagSet) *stateFlags {
	var s stateFlags
	fs.StringVar(&s.state, "state", "", "list the jobs in this `state`: queued, delayed, running, failed, succeeded, dead or cancelled")
	fs.StringVar(&s.schedule, "schedule", "", "with -state: only jobs of this schedule `id`")
	fs.StringVar(&s.since, "since", "", "with -state: only jobs since this RFC 3339 `time` or this long ago (1h)")
	fs.StringVar(&s.until, "until", "", "with -state: only jobs until this RFC 3339 `time` or this long ago")
	fs.IntVar(&s.limit, "limit", 0, "with -state: most jobs (default 50, at most 1000)")
	fs.Uint64Var(&s.cursor, "cursor", 0, "with -state: go on from the `next` cursor a previous listing printed")
	return &s
}

func runJobsByState(ctx context.Context, inv *invocation, running jetfleet.RunningJobsRequest, st *stateFlags) error {
	now := time.Now()
	req := jetfleet.JobListRequest{State: st.state, Queue: running.Queue, Kind: running.Kind, ScheduleID: st.schedule, Limit: st.limit, Cursor: st.cursor}
	var err error
	if req.Since, err = timeOrAgo("since", st.since, now); err != nil {
		return usageErrorf(inv.cmd, "%v", err)
	}
	if req.Until, err = timeOrAgo("until", st.until, now); err != nil {
		return usageErrorf(inv.cmd, "%v", err)
	}
	if running.AgentID != "" {
		return usageErrorf(inv.cmd, "-agent lists running jobs only; leave out -state")
	}
	if err := req.Validate(); err != nil {
		return usageErrorf(inv.cmd, "%v", err)
	}
	return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
		res, err := api.ListJobs(ctx, req)
		if err != nil {
			return err
		}
		return inv.print(res, func(out io.Writer) error { return printJobList(out, req, res) })
	})
}

func printJobList(out io.Writer, req jetfleet.JobListRequest, res *jetfleet.JobListResponse) error {
	if len(res.Jobs) == 0 {
		fmt.Fprintf(out, "no %s jobs (%d read)\n", req.State, res.Scanned)
	} else {
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "JOB\tQUEUE\tKIND\tSCHEDULE\tSTATE\tSINCE\tATTEMPT\tAGENT\tERROR")
		for _, j := range res.Jobs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", j.JobID, j.Queue, j.Kind, dash(j.ScheduleID), j.State,
				j.Time.UTC().Format(time.RFC3339), attemptOf(j), dash(j.AgentID), truncate(firstLine(j.Error+reasonOf(j)), 60))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if res.Next != 0 {
		fmt.Fprintf(out, "more: jetfleet jobs ls -state %s -cursor %d (and the same filters)\n", req.State, res.Next)
	}
	return nil
}

func attemptOf(j jetfleet.JobListEntry) string {
	switch {
	case j.Attempt == 0:
		return "-"
	case j.MaxAttempts > 0:
		return fmt.Sprintf("%d/%d", j.Attempt, j.MaxAttempts)
	}
	return fmt.Sprint(j.Attempt)
}

func reasonOf(j jetfleet.JobListEntry) string {
	if j.Reason == "" {
		return ""
	}
	if j.Error == "" {
		return j.Reason
	}
	return " (" + j.Reason + ")"
}

func setupJobsTrends(fs *flag.FlagSet) action {
	var req jetfleet.TrendsRequest
	fs.StringVar(&req.Kind, "kind", "", "the trend of this job `kind` (with -queue)")
	fs.StringVar(&req.Queue, "queue", jetfleet.DefaultQueue, "the kind's `queue`")
	fs.StringVar(&req.ScheduleID, "schedule", "", "the trend of this schedule `id`")
	fs.StringVar(&req.Resolution, "res", protocol.TrendMinute, "bucket `size`: m (minutes, kept 48h) or h (hours, kept 30 days)")
	since := fs.String("since", "", "buckets since this RFC 3339 `time` or this long ago (default 6h for m, 7 days for h)")
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(0); err != nil {
			return err
		}
		if req.Kind != "" && req.ScheduleID != "" {
			return usageErrorf(inv.cmd, "give -kind or -schedule, not both")
		}
		var err error
		if req.Since, err = timeOrAgo("since", *since, time.Now()); err != nil {
			return usageErrorf(inv.cmd, "%v", err)
		}
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
			if req.Kind == "" && req.ScheduleID == "" {
				list, err := api.TrendList(ctx)
				if err != nil {
					return err
				}
				return inv.print(list, func(out io.Writer) error { return printTrendList(out, list) })
			}
			if req.ScheduleID != "" {
				req.Queue = ""
			}
			res, err := api.Trends(ctx, req)
			if err != nil {
				return err
			}
			return inv.print(res, func(out io.Writer) error { return printTrend(out, res) })
		})
	}
}

func printTrendList(out io.Writer, list *jetfleet.TrendListResponse) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERIES\tVERDICT\tRECENT RUNS\tP95 RECENT\tP95 BASELINE\tFAILED RECENT\tFAILED BASELINE\tWHY")
	for _, s := range list.Series {
		verdict := "steady"
		if s.Degrading {
			verdict = "DEGRADING"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%.0f%%\t%.0f%%\t%s\n", s.Series, verdict, s.Recent.Runs, s.Recent.P95.Round(time.Millisecond),
			s.Baseline.P95.Round(time.Millisecond), 100*s.Recent.FailureRate, 100*s.Baseline.FailureRate, dash(strings.Join(s.Reasons, "; ")))
	}
	return tw.Flush()
}

func printTrend(out io.Writer, res *jetfleet.TrendsResponse) error {
	if s := res.Status; s != nil {
		verdict := "steady"
		if s.Degrading {
			verdict = "DEGRADING since " + s.Since.UTC().Format(time.RFC3339) + ": " + strings.Join(s.Reasons, "; ")
		}
		fmt.Fprintf(out, "%s: %s\n  recent %s: %d runs, p95 %s, %.0f%% failed attempts; baseline: %d runs, p95 %s, %.0f%%\n", res.Series, verdict,
			s.Recent.To.Sub(s.Recent.From).Round(time.Minute), s.Recent.Runs, s.Recent.P95.Round(time.Millisecond), 100*s.Recent.FailureRate,
			s.Baseline.Runs, s.Baseline.P95.Round(time.Millisecond), 100*s.Baseline.FailureRate)
	} else {
		fmt.Fprintf(out, "%s: no verdict yet\n", res.Series)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUCKET\tRUNS\tSUCCEEDED\tDEAD\tRETRIED\tP50\tP95\tDELAY P95")
	for i := range res.Buckets {
		b := &res.Buckets[i]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", b.Start.UTC().Format(time.RFC3339), b.Runs, b.Succeeded, b.Dead, b.AttemptFailures,
			b.P50().Round(time.Microsecond), b.P95().Round(time.Microsecond), b.DelayP95().Round(time.Microsecond))
	}
	return tw.Flush()
}
