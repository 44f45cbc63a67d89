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
	register(&command{name: "schedule", summary: "manage schedules: schedule add|ls|get|rm|pause|resume|trigger|preview|backfill", subs: []*command{
		{name: "add", args: "<id> | -f <file|->", summary: "Store a schedule, from flags or a JSON definition (docs/scheduling.md).",
			help: "With -replace, an existing schedule of the same id is updated instead.", setup: setupScheduleAdd},
		{name: "ls", summary: "List schedules, one page at a time.", setup: setupScheduleList},
		{name: "get", args: "<id>", summary: "Print a schedule, its state and its next fire times.", setup: setupScheduleGet},
		{name: "rm", args: "<id>", summary: "Delete a schedule and its state.", setup: setupScheduleRemove},
		{name: "pause", args: "<id>", summary: "Stop a schedule from firing.", setup: setupSchedulePause},
		{name: "resume", args: "<id>", summary: "Let a paused schedule fire again, from now on.",
			help: "Times that passed while it was paused are not caught up.", setup: setupScheduleResume},
		{name: "trigger", args: "<id>", summary: "Fire a schedule now, respecting its overlap policy.",
			help: "A trigger the overlap policy skips is refused (exit status 1); one it buffers fires later.", setup: setupScheduleTrigger},
		{name: "preview", args: "<id> | [definition flags]", summary: "Print the next nominal fire times, in the schedule's zone.",
			setup: setupSchedulePreview},
		{name: "backfill", args: "-from <time> -to <time> <id>", summary: "Fire every nominal time of a past range, oldest first.",
			setup: setupScheduleBackfill},
	}})
	for _, c := range root.sub("schedule").subs {
		c.fleet, c.output = true, true
	}
}

const scheduleID = "the schedule <id>"

// definitionFlags are the flags that describe a schedule.
type definitionFlags struct {
	file, description                            string
	cron, zone, every, phase, anchor, at, event  string
	after                                        listFlag
	queue, kind, payload, template, backoff      string
	workflow                                     string
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
	fs.StringVar(&d.workflow, "workflow", "", "start a run of this stored `workflow` instead of a job (the payload is its input; not with -kind)")
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
		return time.Time{}, flagValueErrorf("-%s %q is not an RFC 3339 time such as 2026-01-02T15:04:05Z", flagName, v)
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
		return 0, flagValueErrorf("-%s %q is not a duration such as 30s or 1h", flagName, v)
	}
	return jetfleet.Duration(d), nil
}

// build makes the definition of id from the flags, or reads the file.
func (d *definitionFlags) build(id string) (*jetfleet.Schedule, error) {
	if d.file != "" {
		name := d.file
		var data []byte
		var err error
		if d.file == "-" {
			name = "standard input"
			data, err = io.ReadAll(os.Stdin)
		} else {
			data, err = os.ReadFile(d.file)
		}
		if err != nil {
			return nil, fmt.Errorf("-f: %w", err)
		}
		doc, err := documentJSON(name, data)
		if err != nil {
			return nil, fmt.Errorf("-f: %w", err)
		}
		s, err := jetfleet.DecodeSchedule(doc)
		if err != nil {
			return nil, fmt.Errorf("-f: %s: %w", name, err)
		}
		return s, nil
	}
	s := &jetfleet.Schedule{ID: id, Description: d.description, Paused: d.paused, Note: d.note,
		Spec:   jetfleet.Spec{Cron: d.cron, Zone: d.zone},
		Target: jetfleet.Target{Queue: d.queue, Kind: d.kind, PayloadTemplate: d.template, Timeout: jetfleet.Duration(d.timeout), MaxAttempts: d.attempts},
		Policy: jetfleet.Policy{Overlap: d.overlap, Misfire: d.misfire, MaxCatchUp: d.maxCatchUp}}
	if d.workflow != "" {
		if d.kind != "" {
			return nil, flagValueErrorf("-workflow and -kind: a schedule starts a workflow run or fires a job, not both")
		}
		s.Target.Queue, s.Target.Workflow = "", d.workflow
	}
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
			return nil, flagValueErrorf("-payload is not JSON: %s", d.payload)
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

func setupScheduleAdd(fs *flag.FlagSet) action {
	d := addDefinitionFlags(fs, true)
	replace := fs.Bool("replace", false, "update the schedule if it exists")
	return func(ctx context.Context, inv *invocation) error {
		switch {
		case d.file == "":
			if err := inv.wantArgs(1, scheduleID+" (or -f file)"); err != nil {
				return err
			}
		case len(inv.args) > 0:
			return usageErrorf(inv.cmd, "schedule add takes %s or -f, not both (the file holds the id)", scheduleID)
		}
		def, err := d.build(first(inv.args))
		if err != nil {
			return err
		}
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
			info, err := api.AddSchedule(ctx, def)
			exists := errors.Is(err, protocol.Code(protocol.CodeAlreadyExists))
			if exists && *replace {
				info, err = api.UpdateSchedule(ctx, def, 0)
			} else if exists {
				return &protocol.Error{Code: protocol.CodeAlreadyExists, Field: "id",
					Message: fmt.Sprintf("schedule %q exists: pass -replace to update it", def.ID)}
			}
			if err != nil {
				return err
			}
			return inv.print(info, func(out io.Writer) error {
				fmt.Fprintf(out, "schedule %s stored (revision %d)\n", info.Schedule.ID, info.Revision)
				printNextFires(out, info.NextFires)
				if info.Schedule.Target.Workflow == "" {
					fmt.Fprint(out, unknownQueueNote(ctx, api, info.Schedule.Target.Queue))
				}
				return nil
			})
		})
	}
}

func first(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}

func printNextFires(out io.Writer, times []time.Time) {
	for _, t := range times {
		fmt.Fprintf(out, "  next: %s\n", t.Format(time.RFC3339))
	}
}

func setupScheduleList(fs *flag.FlagSet) action {
	after := fs.String("after", "", "start after this schedule `id`")
	limit := fs.Int("limit", 100, "schedules per page (at most 1000)")
	all := fs.Bool("all", false, "list every page")
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(0); err != nil {
			return err
		}
		c, api, err := inv.connectAPI()
		if err != nil {
			return err
		}
		defer c.close()
		list := jetfleet.ScheduleListResponse{Schedules: []jetfleet.ScheduleSummary{}}
		req := jetfleet.ScheduleListRequest{After: *after, Limit: *limit}
		for {
			rctx, cancel := c.ctx(ctx)
			page, err := api.ListSchedules(rctx, req)
			cancel()
			if err != nil {
				return err
			}
			list.Schedules, list.Next = append(list.Schedules, page.Schedules...), page.Next
			if !*all || page.Next == "" {
				break
			}
			req.After = page.Next
		}
		return inv.print(list, func(out io.Writer) error {
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTRIGGER\tTARGET\tSTATE\tNEXT FIRE\tLAST FIRE")
			for _, s := range list.Schedules {
				state := "active"
				if s.Paused {
					state = "paused"
				}
				if s.Running != "" {
					state += ", running " + s.Running
				}
				fmt.Fprintf(tw, "%s\t%s\t%s/%s\t%s\t%s\t%s\n", s.ID, s.Trigger, s.Queue, s.Kind, state, timeOrDash(s.NextFire), timeOrDash(s.LastFire))
			}
			if list.Next != "" {
				fmt.Fprintf(tw, "(more: -after %s)\n", list.Next)
			}
			return tw.Flush()
		})
	}
}

func timeOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339)
}

// oneID is the action of a command that takes a schedule id and nothing else.
func oneID(fn func(ctx context.Context, inv *invocation, api *jetfleet.Client, id string) error) action {
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(1, scheduleID); err != nil {
			return err
		}
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error { return fn(ctx, inv, api, inv.args[0]) })
	}
}

func setupScheduleGet(*flag.FlagSet) action {
	return oneID(func(ctx context.Context, inv *invocation, api *jetfleet.Client, id string) error {
		info, err := api.GetSchedule(ctx, id)
		if err != nil {
			return err
		}
		return inv.print(info, func(out io.Writer) error { return printSchedule(out, info) })
	})
}

// printSchedule prints a schedule one field a line.
func printSchedule(out io.Writer, info *jetfleet.ScheduleInfo) error {
	s := info.Schedule
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "SCHEDULE\t%s (revision %d)\n", s.ID, info.Revision)
	if s.Description != "" {
		fmt.Fprintf(tw, "DESCRIPTION\t%s\n", s.Description)
	}
	fmt.Fprintf(tw, "TRIGGER\t%s\n", describeTrigger(s.Spec))
	if s.Target.Workflow != "" {
		fmt.Fprintf(tw, "TARGET\tworkflow %s (%s)\n", s.Target.Workflow, protocol.WorkflowStartSubject(s.Target.Workflow))
	} else {
		fmt.Fprintf(tw, "TARGET\t%s\n", protocol.JobSubject(s.Target.Queue, s.Target.Kind))
	}
	state := "active"
	if s.Paused {
		state = "paused"
		if s.Note != "" {
			state += ": " + s.Note
		}
	}
	fmt.Fprintf(tw, "STATE\t%s\n", state)
	if p := s.Policy; p.Overlap != "" || p.Misfire != "" {
		fmt.Fprintf(tw, "POLICY\toverlap %s, misfire %s\n", orDefault(p.Overlap, jetfleet.OverlapAllow), orDefault(p.Misfire, jetfleet.MisfireFireOnce))
	}
	for _, t := range info.NextFires {
		fmt.Fprintf(tw, "NEXT FIRE\t%s\n", t.Format(time.RFC3339))
	}
	if st := info.State; st != nil {
		if f := st.LastFire; f != nil {
			fmt.Fprintf(tw, "LAST FIRE\t%s (job %s, nominal %s)\n", f.FiredAt.Format(time.RFC3339), f.JobID, f.NominalTime.Format(time.RFC3339))
		}
		if st.RunningJobID != "" {
			fmt.Fprintf(tw, "RUNNING\t%s\n", st.RunningJobID)
		}
		fmt.Fprintf(tw, "COUNTS\t%d fired, %d skipped, %d missed\n", st.Fires, st.Skips, st.Misses)
	}
	return tw.Flush()
}

func describeTrigger(sp jetfleet.Spec) string {
	switch {
	case sp.Cron != "":
		return fmt.Sprintf("cron %q in %s", sp.Cron, orDefault(sp.Zone, "UTC"))
	case sp.Interval != nil:
		return "every " + sp.Interval.Every.D().String()
	case sp.At != nil:
		return "at " + sp.At.Format(time.RFC3339)
	case sp.Event != nil:
		return "event on " + sp.Event.Subject
	case sp.After != nil:
		var on []string
		for _, u := range sp.After.On {
			switch {
			case u.ScheduleID != "":
				on = append(on, u.ScheduleID)
			default:
				on = append(on, orDefault(u.Queue, "*")+"/"+u.Kind)
			}
		}
		return "after " + strings.Join(on, ", ")
	}
	return "-"
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func setupScheduleRemove(*flag.FlagSet) action {
	return oneID(func(ctx context.Context, inv *invocation, api *jetfleet.Client, id string) error {
		if err := api.RemoveSchedule(ctx, id); err != nil {
			return err
		}
		return inv.print(jetfleet.ScheduleIDRequest{ID: id}, func(out io.Writer) error {
			_, err := fmt.Fprintf(out, "schedule %s removed\n", id)
			return err
		})
	})
}

func setupSchedulePause(fs *flag.FlagSet) action {
	note := fs.String("note", "", "why the schedule is paused")
	return oneID(func(ctx context.Context, inv *invocation, api *jetfleet.Client, id string) error {
		info, err := api.PauseSchedule(ctx, id, *note)
		if err != nil {
			return err
		}
		return inv.print(info, func(out io.Writer) error {
			_, err := fmt.Fprintf(out, "schedule %s paused\n", id)
			return err
		})
	})
}

func setupScheduleResume(*flag.FlagSet) action {
	return oneID(func(ctx context.Context, inv *invocation, api *jetfleet.Client, id string) error {
		info, err := api.ResumeSchedule(ctx, id)
		if err != nil {
			return err
		}
		return inv.print(info, func(out io.Writer) error {
			fmt.Fprintf(out, "schedule %s resumed\n", id)
			printNextFires(out, info.NextFires)
			return nil
		})
	})
}

func setupScheduleTrigger(*flag.FlagSet) action {
	return oneID(func(ctx context.Context, inv *invocation, api *jetfleet.Client, id string) error {
		res, err := api.TriggerSchedule(ctx, id)
		if err != nil {
			return err
		}
		err = inv.print(res, func(out io.Writer) error {
			if res.Outcome == "fired" {
				_, err := fmt.Fprintf(out, "fired job %s\n", res.JobID)
				return err
			}
			_, err := fmt.Fprintf(out, "%s: %s (job %s)\n", res.Outcome, res.Reason, res.JobID)
			return err
		})
		if res.Outcome == "skipped" {
			err = errors.Join(err, fmt.Errorf("%w: schedule %s: the trigger was skipped (%s)", errRefused, id, res.Reason))
		}
		return err
	})
}

func setupSchedulePreview(fs *flag.FlagSet) action {
	d := addDefinitionFlags(fs, true)
	count := fs.Int("count", 10, "how many times")
	from := fs.String("from", "", "first RFC 3339 `time` to consider (default now)")
	return func(ctx context.Context, inv *invocation) error {
		req := jetfleet.PreviewRequest{Count: *count}
		if *from != "" {
			t, err := parseTime("from", *from)
			if err != nil {
				return err
			}
			req.From = t
		}
		definition := d.file != "" || d.cron != "" || d.every != "" || d.at != "" || d.event != "" || len(d.after) > 0
		switch {
		case !definition:
			if err := inv.wantArgs(1, scheduleID+" (or a definition: -cron, -every, -at, -f…)"); err != nil {
				return err
			}
			req.ID = inv.args[0]
		case len(inv.args) > 0:
			return usageErrorf(inv.cmd, "schedule preview takes %s or a definition, not both", scheduleID)
		default:
			def, err := d.build("preview")
			if err != nil {
				return err
			}
			if def.Target.Kind == "" && def.Target.Workflow == "" {
				def.Target.Kind = "preview"
			}
			req.Schedule = def
		}
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
			res, err := api.PreviewSchedule(ctx, req)
			if err != nil {
				return err
			}
			return inv.print(res, func(out io.Writer) error {
				for _, t := range res.Times {
					fmt.Fprintln(out, t.Format(time.RFC3339))
				}
				return nil
			})
		})
	}
}

func setupScheduleBackfill(fs *flag.FlagSet) action {
	fromFlag := fs.String("from", "", "first RFC 3339 `time` of the range (inclusive)")
	toFlag := fs.String("to", "", "last RFC 3339 `time` of the range (inclusive, not in the future)")
	maxFires := fs.Int("max", 0, "fire at most this many (default and cap: the scheduler's max_backfill)")
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(1, scheduleID); err != nil {
			return err
		}
		if *fromFlag == "" || *toFlag == "" {
			return usageErrorf(inv.cmd, "schedule backfill needs -from and -to")
		}
		from, err := parseTime("from", *fromFlag)
		if err != nil {
			return err
		}
		to, err := parseTime("to", *toFlag)
		if err != nil {
			return err
		}
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
			res, err := api.BackfillSchedule(ctx, inv.args[0], from, to, *maxFires)
			if err != nil {
				return err
			}
			return inv.print(res, func(out io.Writer) error {
				fmt.Fprintf(out, "fired %d (%d already published) from %s to %s\n", res.Fired, res.Duplicates, res.First.Format(time.RFC3339), res.Last.Format(time.RFC3339))
				if res.Truncated {
					fmt.Fprintln(out, "more times are left in the range: run again from after the last one")
				}
				return nil
			})
		})
	}
}
