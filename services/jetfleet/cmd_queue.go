package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

func init() {
	register(&command{name: "queue", summary: "list, create and remove queues: queue ls|add|rm", subs: []*command{
		{name: "ls", summary: "List the queues (their consumers on JOBS) and the jobs no queue serves.",
			fleet: true, output: true, setup: func(*flag.FlagSet) action { return runQueueList }},
		{name: "add", args: "<queue>", summary: "Create a queue, or change the settings of one not declared under topology.queues.",
			help: "Agents serving it keep these settings.", fleet: true, output: true, setup: setupQueueAdd},
		{name: "rm", args: "<queue>", summary: "Remove a queue.",
			help: "One that still holds jobs is refused unless -force; its jobs are then dead-lettered with reason\n" +
				"unroutable. Stop the queue's agents first: one that starts creates it again.",
			fleet: true, output: true, setup: setupQueueRemove},
	}})
}

func runQueueList(ctx context.Context, inv *invocation) error {
	if err := inv.wantArgs(0); err != nil {
		return err
	}
	return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
		res, err := api.Queues(ctx)
		if err != nil {
			return err
		}
		return inv.print(queuesResponseJSON{QueuesResponse: *res, Queues: queuesJSON(res.Queues)}, func(out io.Writer) error {
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "QUEUE\tPENDING\tIN FLIGHT\tACK WAIT\tMAX DELIVER\tPAUSED\tDECLARED")
			for _, q := range res.Queues {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%s\n", q.Queue, pendingText(q), q.AckPending, q.AckWait, q.MaxDeliver,
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
	})
}

func setupQueueAdd(fs *flag.FlagSet) action {
	var req jetfleet.QueueAddRequest
	fs.DurationVar(&req.AckWait, "ack-wait", 0, "how long a delivered job may go without an ack or progress (default 30s)")
	fs.IntVar(&req.MaxDeliver, "max-deliver", 0, "deliveries of one job before the supervisor dead-letters it (default 20)")
	fs.IntVar(&req.MaxAckPending, "max-ack-pending", 0, "jobs in flight on the queue across the fleet (default 10000)")
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(1, "the <queue>"); err != nil {
			return err
		}
		req.Queue = inv.args[0]
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
			res, err := api.AddQueue(ctx, req)
			if err != nil {
				return err
			}
			view := queueAddJSON{QueueAddResponse: *res, Queue: queuesJSON([]jetfleet.QueueStatus{res.Queue})[0]}
			return inv.print(view, func(out io.Writer) error {
				verb := "queue exists"
				if res.Created {
					verb = "queue created"
				}
				_, err := fmt.Fprintf(out, "%s: %s (ack wait %s, max deliver %d)\n", verb, res.Queue.Queue, res.Queue.AckWait, res.Queue.MaxDeliver)
				return err
			})
		})
	}
}

func setupQueueRemove(fs *flag.FlagSet) action {
	var req jetfleet.QueueRemoveRequest
	fs.BoolVar(&req.Force, "force", false, "remove a queue that still holds jobs (they are dead-lettered as unroutable)")
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(1, "the <queue>"); err != nil {
			return err
		}
		req.Queue = inv.args[0]
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
			res, err := api.RemoveQueue(ctx, req)
			if err != nil {
				return err
			}
			return inv.print(res, func(out io.Writer) error {
				fmt.Fprintf(out, "queue removed: %s", res.Queue)
				if res.Jobs > 0 {
					fmt.Fprintf(out, " (%d jobs left in it are dead-lettered as unroutable)", res.Jobs)
				}
				_, err := fmt.Fprintln(out)
				return err
			})
		})
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "-"
}

// pendingText is a queue's waiting jobs, split by priority when some are
// not of the default one: "120 (high 20, default 100)".
func pendingText(q jetfleet.QueueStatus) string {
	text := strconv.FormatUint(q.Pending, 10)
	var parts []string
	for _, p := range protocol.Priorities {
		if n, ok := q.PendingByPriority[p]; ok && n > 0 {
			parts = append(parts, p+" "+strconv.FormatUint(n, 10))
		}
	}
	if len(parts) > 0 {
		text += " (" + strings.Join(parts, ", ") + ")"
	}
	return text
}
