package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

func init() {
	register(&command{name: "dlq", summary: "inspect and replay dead letters: dlq ls|show|replay|purge", subs: []*command{
		{name: "ls", args: "[filter flags]", summary: "List dead letters, oldest first.", fleet: true, output: true, setup: setupDLQList},
		{name: "show", args: "<sequence>", summary: "Print one dead letter, payload and headers included.",
			fleet: true, output: true, setup: func(*flag.FlagSet) action { return runDLQShow }},
		{name: "replay", args: "<sequence> | -all | [filter flags]",
			summary: "Publish dead letters again as new jobs (fresh attempts, same job id, Jetfleet-Replayed-From).",
			help: "A letter is replayed once unless -force: replaying a <sequence> replayed before is refused (exit\n" +
				"status 1); a filtered replay skips such letters and says how many.",
			fleet: true, output: true, setup: setupDLQReplay},
		{name: "purge", args: "<sequence> | -all | [filter flags]", summary: "Delete dead letters.",
			help:  "Purging a <sequence> that is not there fails (exit status 1).",
			fleet: true, output: true, setup: setupDLQPurge},
	}})
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
		return time.Time{}, flagValueErrorf("-%s %q is neither an RFC 3339 time nor a duration such as 1h", flagName, v)
	}
	return t, nil
}

func setupDLQList(fs *flag.FlagSet) action {
	ff := addDLQFilterFlags(fs)
	limit := fs.Int("limit", 100, "most letters to list")
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(0); err != nil {
			return err
		}
		filter, err := ff.filter(time.Now())
		if err != nil {
			return err
		}
		c, api, err := inv.connectAPI()
		if err != nil {
			return err
		}
		defer c.close()
		letters := []jetfleet.DeadLetterEntry{}
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
		return inv.print(letters, func(out io.Writer) error {
			if len(letters) == 0 {
				_, err := fmt.Fprintln(out, "no dead letters")
				return err
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
		})
	}
}

func runDLQShow(ctx context.Context, inv *invocation) error {
	seq, err := sequenceArg(inv, true)
	if err != nil {
		return err
	}
	return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
		e, err := api.DeadLetter(ctx, seq)
		if err != nil {
			return err
		}
		return inv.print(e, func(out io.Writer) error { return printDeadLetter(out, e) })
	})
}

// printDeadLetter prints a dead letter one field a line, its headers and payload last.
func printDeadLetter(out io.Writer, e *jetfleet.DeadLetterEntry) error {
	dl, err := e.Decode()
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "DEAD LETTER\t%d\n", e.Sequence)
	fmt.Fprintf(tw, "JOB\t%s\n", e.JobID)
	fmt.Fprintf(tw, "QUEUE\t%s\n", e.Queue)
	fmt.Fprintf(tw, "KIND\t%s\n", e.Kind)
	fmt.Fprintf(tw, "REASON\t%s\n", e.Reason)
	fmt.Fprintf(tw, "ATTEMPTS\t%d\n", e.Attempts)
	fmt.Fprintf(tw, "STORED\t%s\n", e.Time.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "SUBJECT\t%s (%s %d)\n", e.OriginalSubject, protocol.StreamJobs, e.OriginalSequence)
	for _, f := range [][2]string{{"AGENT", e.AgentID}, {"ERROR CODE", e.ErrorCode}, {"ERROR", firstLine(dl.GetLastError())},
		{"TRACE", dl.GetTraceId()}} {
		if f[1] != "" {
			fmt.Fprintf(tw, "%s\t%s\n", f[0], f[1])
		}
	}
	if r := e.Replay; r != nil {
		fmt.Fprintf(tw, "REPLAYED\t%d× (last %s, as %s %d)\n", r.Count, r.At.UTC().Format(time.RFC3339), protocol.StreamJobs, r.JobSequence)
	}
	headers := protocol.HeadersFromDoc(dl.GetHeaders())
	names := make([]string, 0, len(headers))
	for name := range headers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(tw, "HEADER\t%s: %s\n", name, strings.Join(headers[name], ", "))
	}
	payload := dl.GetPayload()
	switch {
	case len(payload) == 0:
		fmt.Fprintln(tw, "PAYLOAD\t(empty)")
	case !utf8.Valid(payload):
		fmt.Fprintf(tw, "PAYLOAD\t(%d bytes, not text: -o json shows them in base64)\n", len(payload))
	default:
		fmt.Fprintf(tw, "PAYLOAD\t%s\n", truncate(strings.ReplaceAll(string(payload), "\n", " "), 2000))
	}
	return tw.Flush()
}

func setupDLQReplay(fs *flag.FlagSet) action {
	ff := addDLQFilterFlags(fs)
	all := fs.Bool("all", false, "replay every dead letter (with no filter)")
	force := fs.Bool("force", false, "replay letters replayed before once more")
	limit := fs.Int("limit", 1000, "most letters to replay")
	return func(ctx context.Context, inv *invocation) error {
		req := jetfleet.ReplayRequest{All: *all, Force: *force, Limit: *limit}
		seq, err := sequenceArg(inv, false)
		if err != nil {
			return err
		}
		req.Sequence = seq
		if req.DLQFilter, err = ff.filter(time.Now()); err != nil {
			return err
		}
		if seq == 0 && !req.All && req.DLQFilter.Empty() {
			return usageErrorf(inv.cmd, "dlq replay needs the dead letter <sequence>, a filter flag or -all")
		}
		c, api, err := inv.connectAPI()
		if err != nil {
			return err
		}
		defer c.close()
		// A bulk replay goes on page by page (the server publishes at most
		// 10000 letters per request) until -limit letters were replayed.
		total := jetfleet.ReplayResponse{Results: []jetfleet.ReplayResult{}}
		for {
			if req.Sequence == 0 {
				req.Limit = *limit - len(total.Results)
			}
			rctx, cancel := context.WithTimeout(ctx, 10*c.timeout)
			res, err := api.ReplayDeadLetters(rctx, req)
			cancel()
			if err != nil {
				return err
			}
			total.Results = append(total.Results, res.Results...)
			total.AlreadyReplayed += res.AlreadyReplayed
			total.Truncated, total.Next = res.Truncated, res.Next
			if !res.Truncated || res.Next == 0 || len(total.Results) >= *limit {
				break
			}
			req.After = res.Next
		}
		err = inv.print(total, func(out io.Writer) error { return printReplay(out, &total, *limit) })
		return errors.Join(err, replayRefusal(&total))
	}
}

func printReplay(out io.Writer, res *jetfleet.ReplayResponse, limit int) error {
	for _, r := range res.Results {
		switch {
		case r.Error != "":
			fmt.Fprintf(out, "dead letter %d (job %s): %s\n", r.DLQSequence, r.JobID, r.Error)
		case r.AlreadyReplayed: // reported by replayRefusal
		default:
			fmt.Fprintf(out, "replayed dead letter %d as job %s (%s %d)\n", r.DLQSequence, r.JobID, protocol.StreamJobs, r.JobSequence)
		}
	}
	if res.AlreadyReplayed > 0 {
		fmt.Fprintf(out, "%d dead letters were replayed before and skipped; use -force to replay them again\n", res.AlreadyReplayed)
	}
	if len(res.Results) == 0 && res.AlreadyReplayed == 0 {
		fmt.Fprintln(out, "no dead letter matched")
	}
	if res.Truncated {
		fmt.Fprintf(out, "stopped at -limit %d; more letters match\n", limit)
	}
	return nil
}

// replayRefusal is the error of a replay that did not do all it was asked:
// a named letter replayed before (without -force), or replays that failed.
func replayRefusal(res *jetfleet.ReplayResponse) error {
	failed := 0
	for _, r := range res.Results {
		switch {
		case r.Error != "":
			failed++
		case r.AlreadyReplayed:
			return fmt.Errorf("%w: dead letter %d (job %s) was replayed before, as %s %d; use -force to replay it once more",
				errRefused, r.DLQSequence, r.JobID, protocol.StreamJobs, r.JobSequence)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d replays failed", failed)
	}
	return nil
}

func setupDLQPurge(fs *flag.FlagSet) action {
	ff := addDLQFilterFlags(fs)
	all := fs.Bool("all", false, "delete every dead letter (with no filter)")
	return func(ctx context.Context, inv *invocation) error {
		req := jetfleet.PurgeRequest{All: *all}
		seq, err := sequenceArg(inv, false)
		if err != nil {
			return err
		}
		req.Sequence = seq
		if req.DLQFilter, err = ff.filter(time.Now()); err != nil {
			return err
		}
		if seq == 0 && !req.All && req.DLQFilter.Empty() {
			return usageErrorf(inv.cmd, "dlq purge needs the dead letter <sequence>, a filter flag or -all")
		}
		c, api, err := inv.connectAPI()
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
		err = inv.print(res, func(out io.Writer) error {
			_, err := fmt.Fprintf(out, "purged %d dead letters\n", res.Purged)
			return err
		})
		if seq > 0 && res.Purged == 0 {
			err = errors.Join(err, protocol.Errorf(protocol.CodeNotFound, "no dead letter %d: nothing purged", seq))
		}
		return err
	}
}

// sequenceArg reads the dead letter <sequence> argument, required or not.
func sequenceArg(inv *invocation, required bool) (uint64, error) {
	n := 0
	if required {
		n = 1
	}
	if err := inv.wantArgs(n, "the dead letter <sequence>"); err != nil {
		return 0, err
	}
	if len(inv.args) == 0 {
		return 0, nil
	}
	seq, err := strconv.ParseUint(inv.args[0], 10, 64)
	if err != nil || seq == 0 {
		return 0, usageErrorf(inv.cmd, "%s: %q is not a dead letter sequence (a positive number from 'jetfleet dlq ls')", inv.cmd.path(), inv.args[0])
	}
	return seq, nil
}

func truncate(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
