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
	register(command{name: "dlq", summary: "inspect and replay dead letters: dlq ls|show|replay|purge", run: runDLQ})
}

type subcommand struct {
	args, summary string
	run           func(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error
}

var dlqCommands = map[string]subcommand{
	"ls":     {"[filter flags]", "List dead letters, oldest first.", runDLQList},
	"show":   {"<sequence>", "Print one dead letter, payload and headers included, as JSON.", runDLQShow},
	"replay": {"<sequence> | -all | [filter flags]", "Publish dead letters again as new jobs (fresh attempts, same job id, Jetfleet-Replayed-From).\nA letter is replayed once unless -force.", runDLQReplay},
	"purge":  {"<sequence> | -all | [filter flags]", "Delete dead letters.", runDLQPurge},
}

func runDLQ(ctx context.Context, args []string, out io.Writer) error {
	return runSubcommand(ctx, "dlq", []string{"ls", "show", "replay", "purge"}, dlqCommands, args, out)
}

// runSubcommand dispatches "jetfleet <group> <name> ..." to one of cmds.
func runSubcommand(ctx context.Context, group string, order []string, cmds map[string]subcommand, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(out, "usage: jetfleet %s <%s> [flags] [args]\n", group, strings.Join(order, "|"))
		for _, name := range order {
			fmt.Fprintf(out, "  %-8s %s\n", name, strings.SplitN(cmds[name].summary, "\n", 2)[0])
		}
		if len(args) == 0 {
			return errUsage
		}
		return nil
	}
	sc, ok := cmds[args[0]]
	if !ok {
		return fmt.Errorf("unknown %s command %q", group, args[0])
	}
	fs := newFlagSet(group+" "+args[0], sc.args, sc.summary)
	cf := addClientFlags(fs)
	return sc.run(ctx, fs, cf, args[1:], out)
}

// connectSupervisor connects and returns an API client.
func connectSupervisor(cf *clientFlags) (*client, *jetfleet.Client, error) {
	c, err := cf.connect()
	if err != nil {
		return nil, nil, err
	}
	return c, jetfleet.NewClient(c.nc), nil
}

// dlqFilterFlags are the flags that select dead letters.
type dlqFilterFlags struct {
	queue, kind, reason, jobID, since, until string
}

func addDLQFilterFlags(fs *flag.FlagSet) *dlqFilterFlags {
	d := &dlqFilterFlags{}
	fs.StringVar(&d.queue, "queue", "", "only letters of this `queue`")
	fs.StringVar(&d.kind, "kind", "", "only letters of this job `kind`")
	fs.StringVar(&d.reason, "reason", "", "only letters with this `reason` (max_attempts, max_deliveries, non_retryable, …)")
	fs.StringVar(&d.jobID, "job", "", "only letters of this job `id`")
	fs.StringVar(&d.since, "since", "", "only letters stored at or after this RFC 3339 `time` or this long ago (1h)")
	fs.StringVar(&d.until, "until", "", "only letters stored at or before this RFC 3339 `time` or this long ago")
	return d
}

func (d *dlqFilterFlags) filter(now time.Time) (jetfleet.DLQFilter, error) {
	f := jetfleet.DLQFilter{Queue: d.queue, Kind: d.kind, Reason: d.reason, JobID: d.jobID}
	var err error
	if f.Since, err = timeOrAgo("since", d.since, now); err != nil {
		return f, err
	}
	if f.Until, err = timeOrAgo("until", d.until, now); err != nil {
		return f, err
	}
	return f, nil
}

// timeOrAgo reads an RFC 3339 time or a duration before now.
func timeOrAgo(flagName, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("-%s %q is neither an RFC 3339 time nor a duration such as 1h", flagName, v)
	}
	return t, nil
}

func runDLQList(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	ff := addDLQFilterFlags(fs)
	limit := fs.Int("limit", 100, "most letters to list")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		fs.Usage()
		return errUsage
	}
	filter, err := ff.filter(time.Now())
	if err != nil {
		return err
	}
	c, api, err := connectSupervisor(cf)
	if err != nil {
		return err
	}
	defer c.close()
	var letters []jetfleet.DeadLetterEntry
	req := jetfleet.DLQListRequest{DLQFilter: filter}
	for len(letters) < *limit {
		req.Limit = min(*limit-len(letters), 1000)
		rctx, cancel := c.ctx(ctx)
		page, err := api.ListDeadLetters(rctx, req)
		cancel()
		if err != nil {
			return err
		}
		letters = append(letters, page.Letters...)
		if page.Next == 0 {
			break
		}
		req.After = page.Next
	}
	if *asJSON {
		return printJSON(out, letters)
	}
	if len(letters) == 0 {
		fmt.Fprintln(out, "no dead letters")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tQUEUE\tKIND\tJOB\tREASON\tATTEMPTS\tREPLAYED\tLAST ERROR")
	for _, l := range letters {
		replayed := "-"
		if l.Replay != nil {
			replayed = fmt.Sprintf("%d×", l.Replay.Count)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", l.Sequence, l.Time.UTC().Format(time.RFC3339), l.Queue, l.Kind,
			l.JobID, l.Reason, l.Attempts, replayed, truncate(l.LastError, 60))
	}
	return tw.Flush()
}

func runDLQShow(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	seq, err := sequenceArg(fs)
	if err != nil {
		return err
	}
	c, api, err := connectSupervisor(cf)
	if err != nil {
		return err
	}
	defer c.close()
	rctx, cancel := c.ctx(ctx)
	defer cancel()
	e, err := api.DeadLetter(rctx, seq)
	if err != nil {
		return err
	}
	return printJSON(out, e)
}

func runDLQReplay(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	ff := addDLQFilterFlags(fs)
	all := fs.Bool("all", false, "replay every dead letter (with no filter)")
	force := fs.Bool("force", false, "replay letters replayed before once more")
	limit := fs.Int("limit", 1000, "most letters to replay")
	if err := fs.Parse(args); err != nil {
		return err
	}
	req := jetfleet.ReplayRequest{All: *all, Force: *force, Limit: *limit}
	if fs.NArg() > 0 {
		seq, err := sequenceArg(fs)
		if err != nil {
			return err
		}
		req.Sequence = seq
	}
	filter, err := ff.filter(time.Now())
	if err != nil {
		return err
	}
	req.DLQFilter = filter
	c, api, err := connectSupervisor(cf)
	if err != nil {
		return err
	}
	defer c.close()
	// A bulk replay goes on page by page (the server publishes at most
	// 10000 letters per request) until -limit letters were replayed.
	failed, listed, skipped, truncated := 0, 0, 0, false
	for {
		if req.Sequence == 0 {
			req.Limit = *limit - listed
		}
		rctx, cancel := context.WithTimeout(ctx, 10*c.timeout)
		res, err := api.ReplayDeadLetters(rctx, req)
		cancel()
		if err != nil {
			return err
		}
		for _, r := range res.Results {
			switch {
			case r.Error != "":
				failed++
				fmt.Fprintf(out, "dead letter %d (job %s): %s\n", r.DLQSequence, r.JobID, r.Error)
			case r.AlreadyReplayed:
				fmt.Fprintf(out, "dead letter %d (job %s) was replayed before as JOBS %d; use -force to replay it again\n", r.DLQSequence, r.JobID, r.JobSequence)
			default:
				fmt.Fprintf(out, "replayed dead letter %d as job %s (JOBS %d)\n", r.DLQSequence, r.JobID, r.JobSequence)
			}
		}
		listed += len(res.Results)
		skipped += res.AlreadyReplayed
		truncated = res.Truncated
		if !res.Truncated || res.Next == 0 || listed >= *limit {
			break
		}
		req.After = res.Next
	}
	if skipped > 0 {
		fmt.Fprintf(out, "%d dead letters were replayed before; use -force to replay them again\n", skipped)
	}
	if listed == 0 && skipped == 0 {
		fmt.Fprintln(out, "no dead letter matched")
	}
	if truncated {
		fmt.Fprintf(out, "stopped at -limit %d; more letters match\n", *limit)
	}
	if failed > 0 {
		return fmt.Errorf("%d replays failed", failed)
	}
	return nil
}

func runDLQPurge(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	ff := addDLQFilterFlags(fs)
	all := fs.Bool("all", false, "delete every dead letter (with no filter)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	req := jetfleet.PurgeRequest{All: *all}
	if fs.NArg() > 0 {
		seq, err := sequenceArg(fs)
		if err != nil {
			return err
		}
		req.Sequence = seq
	}
	filter, err := ff.filter(time.Now())
	if err != nil {
		return err
	}
	req.DLQFilter = filter
	c, api, err := connectSupervisor(cf)
	if err != nil {
		return err
	}
	defer c.close()
	rctx, cancel := context.WithTimeout(ctx, 10*c.timeout)
	defer cancel()
	res, err := api.PurgeDeadLetters(rctx, req)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "purged %d dead letters\n", res.Purged)
	return nil
}

func sequenceArg(fs *flag.FlagSet) (uint64, error) {
	if fs.NArg() != 1 {
		fs.Usage()
		return 0, errUsage
	}
	seq, err := strconv.ParseUint(fs.Arg(0), 10, 64)
	if err != nil || seq == 0 {
		return 0, protocol.FieldError("sequence", "%q is not a DLQ sequence (a positive number from 'jetfleet dlq ls')", fs.Arg(0))
	}
	return seq, nil
}

func truncate(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
