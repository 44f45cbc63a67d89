package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

func init() {
	register(command{name: "schedule", summary: "manage schedules: schedule add|ls|get|rm|pause|resume|trigger|preview|backfill", run: runSchedule})
}

type scheduleCommand struct {
	args, summary string
	run           func(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error
	flags         func(fs *flag.FlagSet)
}

var scheduleCommands = map[string]scheduleCommand{
	"add":   {"[flags] <id> | -f <file|->", "Store a schedule, from flags or a JSON definition (docs/scheduling.md).\nWith -replace, an existing schedule of the same id is updated instead.", runScheduleAdd, nil},
	"ls":    {"[flags]", "List schedules, one page at a time.", runScheduleList, nil},
	"get":   {"<id>", "Print a schedule, its state and its next fire times as JSON.", runScheduleGet, nil},
	"rm":    {"<id>", "Delete a schedule and its state.", runScheduleRemove, nil},
	"pause": {"[-note text] <id>", "Stop a schedule from firing.", runSchedulePause, nil},
	"resume": {"<id>", "Let a paused schedule fire again, from now on (times that passed while paused are not caught up).",
		runScheduleResume, nil},
	"trigger":  {"<id>", "Fire a schedule now, respecting its overlap policy.", runScheduleTrigger, nil},
	"preview":  {"[flags] <id> | [definition flags]", "Print the next nominal fire times, in the schedule's zone.", runSchedulePreview, nil},
	"backfill": {"-from <time> -to <time> [flags] <id>", "Fire every nominal time of a past range, oldest first.", runScheduleBackfill, nil},
}

func runSchedule(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(out, "usage: jetfleet schedule <add|ls|get|rm|pause|resume|trigger|preview|backfill> [flags] [args]")
		for _, name := range []string{"add", "ls", "get", "rm", "pause", "resume", "trigger", "preview", "backfill"} {
			fmt.Fprintf(out, "  %-9s %s\n", name, strings.SplitN(scheduleCommands[name].summary, "\n", 2)[0])
		}
		if len(args) == 0 {
			return errUsage
		}
		return nil
	}
	sc, ok := scheduleCommands[args[0]]
	if !ok {
		return fmt.Errorf("unknown schedule command %q", args[0])
	}
	fs := newFlagSet("schedule "+args[0], sc.args, sc.summary)
	cf := addClientFlags(fs)
	return sc.run(ctx, fs, cf, args[1:], out)
}

// connectScheduler connects and returns an API client.
func connectScheduler(cf *clientFlags) (*client, *jetfleet.Client, error) {
	c, err := cf.connect()
	if err != nil {
		return nil, nil, err
	}
	return c, jetfleet.NewClient(c.nc), nil
}

// definitionFlags are the flags that describe a schedule.
type definitionFlags struct {
	file, description                            string
	cron, zone, every, phase, anchor, at, event  string
	after                                        listFlag
	queue, kind, payload, template, backoff      string
	timeout                                      time.Duration
	attempts                                     int
	overlap, window, misfire, jitter, start, end string
	maxCatchUp                                   int
	paused                                       bool
	note                                         string
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func addDefinitionFlags(fs *flag.FlagSet, withFile bool) *definitionFlags {
	d := &definitionFlags{}
	if withFile {
		fs.StringVar(&d.file, "f", "", "read the definition as JSON from `file` ('-' for standard input)")
	}
	fs.StringVar(&d.description, "description", "", "what the schedule is for")
	fs.StringVar(&d.cron, "cron", "", "cron `spec`: 5 fields, 6 with seconds first, or @daily, @hourly, @every 10m…")
	fs.StringVar(&d.zone, "zone", "", "IANA time `zone` of the cron spec (default UTC)")
	fs.StringVar(&d.every, "every", "", "fire every `duration` (whole seconds, at least 1s)")
	fs.StringVar(&d.phase, "phase", "", "shift an -every schedule by this `duration`")
	fs.StringVar(&d.anchor, "anchor", "", "RFC 3339 `time` an -every schedule is aligned to (default the Unix epoch)")
	fs.StringVar(&d.at, "at", "", "fire once at this RFC 3339 `time`")
	fs.StringVar(&d.event, "event", "", "fire for every message stored on this `subject` filter")
	fs.Var(&d.after, "after", "fire after a run of this `upstream` succeeds: a schedule id, queue/kind or */kind (repeat for fan-in)")
	fs.StringVar(&d.queue, "queue", "default", "`queue` of the fired jobs")
	fs.StringVar(&d.kind, "kind", "", "`kind` of the fired jobs")
	fs.StringVar(&d.payload, "payload", "", "job payload, a JSON `value`")
	fs.StringVar(&d.template, "payload-template", "", "job payload as a Go text/`template`")
	fs.DurationVar(&d.timeout, "job-timeout", 0, "bound on one attempt of a fired job")
	fs.IntVar(&d.attempts, "max-attempts", 0, "attempts of a fired job before it is dead-lettered")
	fs.StringVar(&d.backoff, "backoff", "", "retry delays of a fired job, comma-separated (1s,10s,1m)")
	fs.StringVar(&d.overlap, "overlap", "", "while the previous run is not over: allow (default), skip, buffer_one or cancel_previous")
	fs.StringVar(&d.window, "catch-up-window", "", "how far back missed times may still fire after downtime (default 24h)")
	fs.StringVar(&d.misfire, "misfire", "", "missed times inside the window: fire_once (default), fire_all or skip")
	fs.IntVar(&d.maxCatchUp, "max-catch-up", 0, "most missed times fire_all fires (default 100)")
	fs.StringVar(&d.jitter, "jitter", "", "delay each fire by up to this `duration`")
	fs.StringVar(&d.start, "start", "", "no nominal time before this RFC 3339 `time`")
	fs.StringVar(&d.end, "end", "", "no nominal time after this RFC 3339 `time`")
	fs.BoolVar(&d.paused, "paused", false, "store the schedule paused")
	fs.StringVar(&d.note, "note", "", "note kept with a paused schedule")
	return d
}

func parseTime(flagName, v string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("-%s %q is not an RFC 3339 time such as 2026-01-02T15:04:05Z", flagName, v)
	}
	return t, nil
}

// duration reads a Go duration flag into a jetfleet.Duration; the server
// validates ranges and names the field.
func duration(flagName, v string) (jetfleet.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("-%s %q is not a duration such as 30s or 1h", flagName, v)
	}
	return jetfleet.Duration(d), nil
}

// build makes the definition of id from the flags, or reads the file.
func (d *definitionFlags) build(id string) (*jetfleet.Schedule, error) {
	if d.file != "" {
		var data []byte
		var err error
		if d.file == "-" {
			data, err = io.ReadAll(os.Stdin)
		} else {
			data, err = os.ReadFile(d.file)
		}
		if err != nil {
			return nil, err
		}
		return jetfleet.DecodeSchedule(data)
	}
	s := &jetfleet.Schedule{ID: id, Description: d.description, Paused: d.paused, Note: d.note,
		Spec:   jetfleet.Spec{Cron: d.cron, Zone: d.zone},
		Target: jetfleet.Target{Queue: d.queue, Kind: d.kind, PayloadTemplate: d.template, Timeout: jetfleet.Duration(d.timeout), MaxAttempts: d.attempts},
		Policy: jetfleet.Policy{Overlap: d.overlap, Misfire: d.misfire, MaxCatchUp: d.maxCatchUp}}
	var err error
	if d.every != "" {
		iv := &jetfleet.Interval{}
		if iv.Every, err = duration("every", d.every); err != nil {
			return nil, err
		}
		if iv.Phase, err = duration("phase", d.phase); err != nil {
			return nil, err
		}
		if d.anchor != "" {
			if iv.Anchor, err = parseTime("anchor", d.anchor); err != nil {
				return nil, err
			}
		}
		s.Spec.Interval = iv
	}
	if d.at != "" {
		at, err := parseTime("at", d.at)
		if err != nil {
			return nil, err
		}
		s.Spec.At = &at
	}
	if d.event != "" {
		s.Spec.Event = &jetfleet.EventSpec{Subject: d.event}
	}
	if len(d.after) > 0 {
		dep := &jetfleet.Dependency{}
		for _, a := range d.after {
			queue, kind, isKind := strings.Cut(a, "/")
			switch {
			case !isKind:
				dep.On = append(dep.On, jetfleet.Upstream{ScheduleID: a})
			case queue == "*":
				dep.On = append(dep.On, jetfleet.Upstream{Kind: kind})
			default:
				dep.On = append(dep.On, jetfleet.Upstream{Queue: queue, Kind: kind})
			}
		}
		s.Spec.After = dep
	}
	if d.payload != "" {
		if !json.Valid([]byte(d.payload)) {
			return nil, fmt.Errorf("-payload is not JSON: %s", d.payload)
		}
		s.Target.Payload = json.RawMessage(d.payload)
	}
	if d.backoff != "" {
		for _, part := range strings.Split(d.backoff, ",") {
			b, err := duration("backoff", strings.TrimSpace(part))
			if err != nil {
				return nil, err
			}
			s.Target.Backoff = append(s.Target.Backoff, b)
		}
	}
	if s.Policy.CatchUpWindow, err = duration("catch-up-window", d.window); err != nil {
		return nil, err
	}
	if s.Policy.Jitter, err = duration("jitter", d.jitter); err != nil {
		return nil, err
	}
	if d.start != "" {
		if s.Policy.StartAt, err = parseTime("start", d.start); err != nil {
			return nil, err
		}
	}
	if d.end != "" {
		if s.Policy.EndAt, err = parseTime("end", d.end); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func runScheduleAdd(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	d := addDefinitionFlags(fs, true)
	replace := fs.Bool("replace", false, "update the schedule if it exists")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if (d.file == "") != (fs.NArg() == 1) || fs.NArg() > 1 {
		fs.Usage()
		return errUsage
	}
	def, err := d.build(fs.Arg(0))
	if err != nil {
		return err
	}
	c, api, err := connectScheduler(cf)
	if err != nil {
		return err
	}
	defer c.close()
	rctx, cancel := c.ctx(ctx)
	defer cancel()
	info, err := api.AddSchedule(rctx, def)
	if *replace && errors.Is(err, protocol.Code(protocol.CodeAlreadyExists)) {
		info, err = api.UpdateSchedule(rctx, def, 0)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "schedule %s stored (revision %d)\n", info.Schedule.ID, info.Revision)
	for _, t := range info.NextFires {
		fmt.Fprintf(out, "  next: %s\n", t.Format(time.RFC3339))
	}
	return nil
}

func runScheduleList(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	after := fs.String("after", "", "start after this schedule `id`")
	limit := fs.Int("limit", 100, "schedules per page (at most 1000)")
	all := fs.Bool("all", false, "list every page")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, api, err := connectScheduler(cf)
	if err != nil {
		return err
	}
	defer c.close()
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	if !*asJSON {
		fmt.Fprintln(tw, "ID\tTRIGGER\tTARGET\tSTATE\tNEXT FIRE\tLAST FIRE")
	}
	req := jetfleet.ScheduleListRequest{After: *after, Limit: *limit}
	for {
		rctx, cancel := c.ctx(ctx)
		page, err := api.ListSchedules(rctx, req)
		cancel()
		if err != nil {
			return err
		}
		if *asJSON {
			data, _ := json.MarshalIndent(page, "", "  ")
			fmt.Fprintln(out, string(data))
		} else {
			for _, s := range page.Schedules {
				state := "active"
				if s.Paused {
					state = "paused"
				}
				if s.Running != "" {
					state += ", running " + s.Running
				}
				fmt.Fprintf(tw, "%s\t%s\t%s/%s\t%s\t%s\t%s\n", s.ID, s.Trigger, s.Queue, s.Kind, state, timeOrDash(s.NextFire), timeOrDash(s.LastFire))
			}
		}
		if !*all || page.Next == "" {
			if page.Next != "" && !*asJSON {
				fmt.Fprintf(tw, "(more: -after %s)\n", page.Next)
			}
			break
		}
		req.After = page.Next
	}
	return tw.Flush()
}

func timeOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339)
}

func oneID(fs *flag.FlagSet, args []string) (string, error) {
	if err := fs.Parse(args); err != nil {
		return "", err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return "", errUsage
	}
	return fs.Arg(0), nil
}

func printJSON(out io.Writer, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, string(data))
	return err
}

// withAPI connects, runs fn with a bounded context, and closes.
func withAPI(ctx context.Context, cf *clientFlags, fn func(ctx context.Context, api *jetfleet.Client) error) error {
	c, api, err := connectScheduler(cf)
	if err != nil {
		return err
	}
	defer c.close()
	rctx, cancel := c.ctx(ctx)
	defer cancel()
	return fn(rctx, api)
}

func runScheduleGet(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	return withAPI(ctx, cf, func(ctx context.Context, api *jetfleet.Client) error {
		info, err := api.GetSchedule(ctx, id)
		if err != nil {
			return err
		}
		return printJSON(out, info)
	})
}

func runScheduleRemove(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	return withAPI(ctx, cf, func(ctx context.Context, api *jetfleet.Client) error {
		if err := api.RemoveSchedule(ctx, id); err != nil {
			return err
		}
		fmt.Fprintf(out, "schedule %s removed\n", id)
		return nil
	})
}

func runSchedulePause(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	note := fs.String("note", "", "why the schedule is paused")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	return withAPI(ctx, cf, func(ctx context.Context, api *jetfleet.Client) error {
		if _, err := api.PauseSchedule(ctx, id, *note); err != nil {
			return err
		}
		fmt.Fprintf(out, "schedule %s paused\n", id)
		return nil
	})
}

func runScheduleResume(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	return withAPI(ctx, cf, func(ctx context.Context, api *jetfleet.Client) error {
		info, err := api.ResumeSchedule(ctx, id)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "schedule %s resumed\n", id)
		for _, t := range info.NextFires {
			fmt.Fprintf(out, "  next: %s\n", t.Format(time.RFC3339))
		}
		return nil
	})
}

func runScheduleTrigger(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	return withAPI(ctx, cf, func(ctx context.Context, api *jetfleet.Client) error {
		res, err := api.TriggerSchedule(ctx, id)
		if err != nil {
			return err
		}
		if res.Outcome == "fired" {
			fmt.Fprintf(out, "fired job %s\n", res.JobID)
		} else {
			fmt.Fprintf(out, "%s: %s (job %s)\n", res.Outcome, res.Reason, res.JobID)
		}
		return nil
	})
}

func runSchedulePreview(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	d := addDefinitionFlags(fs, true)
	count := fs.Int("count", 10, "how many times")
	from := fs.String("from", "", "first RFC 3339 `time` to consider (default now)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	req := jetfleet.PreviewRequest{Count: *count}
	if *from != "" {
		t, err := parseTime("from", *from)
		if err != nil {
			return err
		}
		req.From = t
	}
	switch {
	case fs.NArg() == 1 && d.file == "" && d.cron == "" && d.every == "" && d.at == "":
		req.ID = fs.Arg(0)
	case fs.NArg() == 0:
		def, err := d.build("preview")
		if err != nil {
			return err
		}
		if def.Target.Kind == "" {
			def.Target.Kind = "preview"
		}
		req.Schedule = def
	default:
		fs.Usage()
		return errUsage
	}
	return withAPI(ctx, cf, func(ctx context.Context, api *jetfleet.Client) error {
		res, err := api.PreviewSchedule(ctx, req)
		if err != nil {
			return err
		}
		for _, t := range res.Times {
			fmt.Fprintln(out, t.Format(time.RFC3339))
		}
		return nil
	})
}

func runScheduleBackfill(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, args []string, out io.Writer) error {
	fromFlag := fs.String("from", "", "first RFC 3339 `time` of the range (inclusive)")
	toFlag := fs.String("to", "", "last RFC 3339 `time` of the range (inclusive, not in the future)")
	maxFires := fs.Int("max", 0, "fire at most this many (default and cap: the scheduler's max_backfill)")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	from, err := parseTime("from", *fromFlag)
	if err != nil {
		return err
	}
	to, err := parseTime("to", *toFlag)
	if err != nil {
		return err
	}
	return withAPI(ctx, cf, func(ctx context.Context, api *jetfleet.Client) error {
		res, err := api.BackfillSchedule(ctx, id, from, to, *maxFires)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "fired %d (%d already published) from %s to %s\n", res.Fired, res.Duplicates, res.First.Format(time.RFC3339), res.Last.Format(time.RFC3339))
		if res.Truncated {
			fmt.Fprintln(out, "more times are left in the range: run again from after the last one")
		}
		return nil
	})
}
