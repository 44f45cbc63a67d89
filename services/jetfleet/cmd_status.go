package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

func init() {
	register(&command{name: "status", summary: "the fleet at a glance: agents, queues, dead letters, jobs needing attention",
		help: "From the supervisor: agents, queues (pending, in flight, paused, circuit breaker), the dead-letter\n" +
			"depth and the jobs that need attention.",
		fleet: true, output: true, setup: func(*flag.FlagSet) action { return runStatus }})
}

func runStatus(ctx context.Context, inv *invocation) error {
	if err := inv.wantArgs(0); err != nil {
		return err
	}
	return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
		st, err := api.Status(ctx)
		if err != nil {
			return err
		}
		return inv.print(statusJSON(st), func(out io.Writer) error { return printStatus(out, st) })
	})
}

func printStatus(out io.Writer, st *jetfleet.FleetStatus) error {
	fmt.Fprintf(out, "supervisor leader: %s\n", dash(st.Leader))
	fmt.Fprintf(out, "agents: %d alive, %d draining, %d dead; running %d of %d slots\n", st.AgentsAlive, st.AgentsDrain,
		st.AgentsDead, st.Running, st.Capacity)
	fmt.Fprintf(out, "dead letters: %d\n", st.DLQDepth)
	fmt.Fprintf(out, "delayed jobs: %d\n", st.Delayed)
	if st.Unroutable > 0 {
		fmt.Fprintf(out, "jobs no queue serves: %d (dead-lettered shortly as unroutable or invalid_subject; jetfleet queue ls lists them)\n", st.Unroutable)
	}
	if len(st.Queues) > 0 {
		fmt.Fprintln(out)
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "QUEUE\tPENDING\tIN FLIGHT\tREDELIVERED\tWAITING PULLS\tACK WAIT\tMAX DELIVER\tBREAKER\tPAUSED")
		for _, q := range st.Queues {
			paused := "-"
			if q.Paused {
				paused = "yes"
				if !q.PausedUntil.IsZero() {
					paused = "until " + q.PausedUntil.UTC().Format(time.RFC3339)
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%d\t%s\t%s\n", q.Queue, pendingText(q), q.AckPending, q.Redelivered, q.Waiting,
				q.AckWait, q.MaxDeliver, q.Breaker, paused)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(st.Attention) > 0 {
		fmt.Fprintln(out)
		fmt.Fprintln(out, "jobs needing attention:")
		return printRunning(out, st.Attention, time.Now())
	}
	return nil
}
