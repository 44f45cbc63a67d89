package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

func init() {
	register(&command{name: "limit", summary: "fleet-wide limits per kind: limit ls|set|rm", subs: []*command{
		{name: "ls", summary: "List the fleet-wide limits, the slots taken and the next start under each rate.",
			fleet: true, output: true, setup: func(*flag.FlagSet) action { return runLimitList }},
		{name: "set", args: "<queue> <kind>", summary: "Set a kind's fleet-wide limit: -concurrency N, -rate R/period (e.g. 100/1m).",
			help: "Jobs over the limit wait on the agent that holds them (event waiting) and spend no attempt.\n" +
				"Setting a limit replaces the kind's previous one.",
			fleet: true, output: true, setup: setupLimitSet},
		{name: "rm", args: "<queue> <kind>", summary: "Lift a kind's fleet-wide limit; its waiting jobs start.",
			fleet: true, output: true, setup: setupLimitRemove},
	}})
}

func runLimitList(ctx context.Context, inv *invocation) error {
	if err := inv.wantArgs(0); err != nil {
		return err
	}
	return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
		limits, err := api.Limits(ctx)
		if err != nil {
			return err
		}
		return inv.print(limits, func(out io.Writer) error {
			if len(limits) == 0 {
				_, err := fmt.Fprintln(out, "no fleet-wide limits (jetfleet limit set <queue> <kind> -concurrency N -rate R/period)")
				return err
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "QUEUE\tKIND\tCONCURRENCY\tRUNNING\tRATE\tNEXT START")
			for _, l := range limits {
				conc, rate, next := "-", "-", "-"
				if l.Limit.Concurrency > 0 {
					conc = strconv.Itoa(l.Limit.Concurrency)
				}
				if l.Limit.Rate > 0 {
					rate = fmt.Sprintf("%d/%s", l.Limit.Rate, l.Limit.Period)
				}
				if !l.NextStart.IsZero() {
					next = l.NextStart.Format(time.RFC3339Nano)
				}
				if l.Invalid != "" {
					rate = "INVALID: " + l.Invalid
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", l.Queue, l.Kind, conc, l.Running, rate, next)
			}
			return tw.Flush()
		})
	})
}

// parseRate reads "R/period" (100/1m, 5/1s).
func parseRate(s string) (rate int, period time.Duration, err error) {
	r, p, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, fmt.Errorf("-rate %q: want R/period, e.g. 100/1m or 5/1s", s)
	}
	if rate, err = strconv.Atoi(r); err != nil || rate <= 0 {
		return 0, 0, fmt.Errorf("-rate %q: the rate must be a whole number above zero", s)
	}
	if period, err = time.ParseDuration(p); err != nil || period <= 0 {
		return 0, 0, fmt.Errorf("-rate %q: the period must be a positive duration, e.g. 1m or 1s", s)
	}
	return rate, period, nil
}

func setupLimitSet(fs *flag.FlagSet) action {
	concurrency := fs.Int("concurrency", 0, "at most this many of the kind's jobs run at once across the fleet")
	rateFlag := fs.String("rate", "", "at most R starts per period, evenly spaced: R/period, e.g. 100/1m")
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(2, "the <queue>", "the <kind>"); err != nil {
			return err
		}
		limit := jetfleet.KindLimit{Concurrency: *concurrency}
		if *rateFlag != "" {
			var err error
			if limit.Rate, limit.Period, err = parseRate(*rateFlag); err != nil {
				return flagValueErrorf("%v", err)
			}
		}
		if limit.Concurrency == 0 && limit.Rate == 0 {
			return flagValueErrorf("give -concurrency N, -rate R/period or both (to lift a limit: jetfleet limit rm %s %s)", inv.args[0], inv.args[1])
		}
		queue, kind := inv.args[0], inv.args[1]
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
			if err := api.SetLimit(ctx, queue, kind, limit); err != nil {
				return err
			}
			doc := protocol.KindLimit{Concurrency: limit.Concurrency, Rate: limit.Rate}
			if limit.Rate > 0 {
				doc.Period = limit.Period.String()
			}
			return inv.print(map[string]any{"queue": queue, "kind": kind, "limit": doc}, func(out io.Writer) error {
				_, err := fmt.Fprintf(out, "limit set: %s/%s %s\n%s", queue, kind, doc, unknownQueueNote(ctx, api, queue))
				return err
			})
		})
	}
}

func setupLimitRemove(*flag.FlagSet) action {
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(2, "the <queue>", "the <kind>"); err != nil {
			return err
		}
		queue, kind := inv.args[0], inv.args[1]
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
			if err := api.DeleteLimit(ctx, queue, kind); err != nil {
				return err
			}
			return inv.print(map[string]any{"queue": queue, "kind": kind, "removed": true}, func(out io.Writer) error {
				_, err := fmt.Fprintf(out, "limit lifted: %s/%s\n", queue, kind)
				return err
			})
		})
	}
}
