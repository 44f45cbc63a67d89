package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

func init() {
	register(command{name: "agents", summary: "agents as the supervisor sees them: agents ls", run: runAgents})
}

var agentsCommands = map[string]subcommand{
	"ls": {"", "List the agents: state (alive, draining, dead), queues, jobs and capacity, last heartbeat.", runAgentsList},
}

func runAgents(ctx context.Context, args []string, out io.Writer) error {
	return runSubcommand(ctx, "agents", []string{"ls"}, agentsCommands, args, out)
}

func runAgentsList(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
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
	res, err := api.Agents(rctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(out, res.Agents)
	}
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
}
