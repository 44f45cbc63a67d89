package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

func init() {
	register(command{name: "queue", summary: "list, create and remove queues: queue ls|add|rm", run: runQueue})
}

var queueCommands = map[string]subcommand{
	"ls": {"", "List the queues (their consumers on JOBS) and the jobs no queue serves.", runQueueList},
	"add": {"<queue>", "Create a queue, or change the settings of one not declared under topology.queues.\n" +
		"Agents serving it keep these settings.", runQueueAdd},
	"rm": {"<queue>", "Remove a queue. One that still holds jobs is refused unless -force; its jobs are then\n" +
		"dead-lettered with reason unroutable. Stop the queue's agents first: one that starts creates it again.", runQueueRemove},
}

func runQueue(ctx context.Context, args []string, out io.Writer) error {
	return runSubcommand(ctx, "queue", []string{"ls", "add", "rm"}, queueCommands, args, out)
}

func runQueueList(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		fs.Usage()
		return errUsage
	}
	return withSupervisor(ctx, cf, func(ctx context.Context, api *jetfleet.Client) error {
		res, err := api.Queues(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(out, res)
		}
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "QUEUE\tPENDING\tIN FLIGHT\tACK WAIT\tMAX DELIVER\tPAUSED\tDECLARED")
		for _, q := range res.Queues {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%s\t%s\n", q.Queue, q.Pending, q.AckPending, q.AckWait, q.MaxDeliver,
				yesNo(q.Paused), yesNo(q.Declared))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(res.Unroutable) > 0 {
			fmt.Fprintln(out)
			fmt.Fprintln(out, "jobs no queue serves (dead-lettered as unroutable or invalid_subject after supervisor.unroutable_after):")
			subjects := make([]string, 0, len(res.Unroutable))
			for s := range res.Unroutable {
				subjects = append(subjects, s)
			}
			sort.Strings(subjects)
			for _, s := range subjects {
				fmt.Fprintf(out, "  %s\t%d\n", s, res.Unroutable[s])
			}
		}
		return nil
	})
}

func runQueueAdd(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	var req jetfleet.QueueAddRequest
	fs.DurationVar(&req.AckWait, "ack-wait", 0, "how long a delivered job may go without an ack or progress (default 30s)")
	fs.IntVar(&req.MaxDeliver, "max-deliver", 0, "deliveries of one job before the supervisor dead-letters it (default 20)")
	fs.IntVar(&req.MaxAckPending, "max-ack-pending", 0, "jobs in flight on the queue across the fleet (default 10000)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fmt.Errorf("queue add needs the <queue> name")
	}
	req.Queue = fs.Arg(0)
	return withSupervisor(ctx, cf, func(ctx context.Context, api *jetfleet.Client) error {
		res, err := api.AddQueue(ctx, req)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(out, res)
		}
		verb := "queue exists"
		if res.Created {
			verb = "queue created"
		}
		fmt.Fprintf(out, "%s: %s (ack wait %s, max deliver %d)\n", verb, res.Queue.Queue, res.Queue.AckWait, res.Queue.MaxDeliver)
		return nil
	})
}

func runQueueRemove(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	var req jetfleet.QueueRemoveRequest
	fs.BoolVar(&req.Force, "force", false, "remove a queue that still holds jobs (they are dead-lettered as unroutable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fmt.Errorf("queue rm needs the <queue> name")
	}
	req.Queue = fs.Arg(0)
	return withSupervisor(ctx, cf, func(ctx context.Context, api *jetfleet.Client) error {
		res, err := api.RemoveQueue(ctx, req)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "queue removed: %s", res.Queue)
		if res.Jobs > 0 {
			fmt.Fprintf(out, " (%d jobs left in it are dead-lettered as unroutable)", res.Jobs)
		}
		fmt.Fprintln(out)
		return nil
	})
}

// withSupervisor connects, runs fn with a bounded context, and closes.
func withSupervisor(ctx context.Context, cf *clientFlags, fn func(ctx context.Context, api *jetfleet.Client) error) error {
	c, api, err := connectSupervisor(cf)
	if err != nil {
		return err
	}
	defer c.close()
	rctx, cancel := c.ctx(ctx)
	defer cancel()
	return fn(rctx, api)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "-"
}
