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
)

func init() {
	register(&command{name: "agents", summary: "agents as the supervisor sees them: agents ls", subs: []*command{
		{name: "ls", summary: "List the agents: state (alive, draining, dead), queues, jobs and capacity, last heartbeat.",
			fleet: true, output: true, setup: func(*flag.FlagSet) action { return runAgentsList }},
	}})
}

func runAgentsList(ctx context.Context, inv *invocation) error {
	if err := inv.wantArgs(0); err != nil {
		return err
	}
	return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
		res, err := api.Agents(ctx)
		if err != nil {
			return err
		}
		return inv.print(agentsJSON(res.Agents), func(out io.Writer) error {
			if len(res.Agents) == 0 {
				fmt.Fprintln(out, "no agents")
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "AGENT\tSTATE\tHOST\tQUEUES\tJOBS\tLAST HEARTBEAT\tVERSION")
			for _, a := range res.Agents {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s ago\t%s\n", a.ID, a.State, dash(a.Hostname), strings.Join(a.Queues, ","),
					a.Jobs, a.Capacity, a.SilentFor.Round(time.Millisecond), dash(a.Version))
			}
			return tw.Flush()
		})
	})
}
