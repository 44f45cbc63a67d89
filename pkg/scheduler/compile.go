package scheduler

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"text/template"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

type triggerKind uint8

const (
	kindTime       triggerKind = iota // cron, interval, one-shot: the timer heap drives it
	kindEvent                         // messages on a subject
	kindDependency                    // job events of upstreams
)

type overlapPolicy uint8

const (
	overlapAllow overlapPolicy = iota
	overlapSkip
	overlapBufferOne
	overlapCancelPrevious
)

type misfirePolicy uint8

const (
	misfireFireOnce misfirePolicy = iota
	misfireFireAll
	misfireSkip
)

// compiled is the in-memory form of a definition the scheduler acts on. It is
// kept small: one leader holds 100,000 of them.
type compiled struct {
	id   string
	kind triggerKind
	trig trigger // kindTime
	loc  *time.Location
	text string // the trigger, for listings

	queue, kindName string
	// workflow: a fire starts a run of workflow kindName (queue is
	// protocol.WorkflowJobQueue, that of the run's job events).
	workflow    bool
	payload     []byte
	tmpl        *template.Template
	timeout     time.Duration
	maxAttempts int32
	backoff     string // header form

	overlap    overlapPolicy
	misfire    misfirePolicy
	maxCatchUp int32
	window     int64 // catch-up window, seconds
	jitter     int64 // nanoseconds
	start, end int64 // nominal bounds, Unix seconds, inclusive

	effectiveFrom int64 // Unix seconds
	paused        bool

	// kindEvent and kindDependency
	stream    string
	filters   []string
	startSeq  uint64
	upstreams []jetfleet.Upstream
	depWindow int64 // seconds
}

var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// compile validates s and builds its in-memory form. Errors are
// *protocol.Error values naming the field.
func compile(s *jetfleet.Schedule) (*compiled, error) {
	if err := protocol.ValidateToken("schedule id", s.ID); err != nil {
		return nil, protocol.FieldError("id", "%v", err)
	}
	if len(s.Description) > maxTextLength {
		return nil, protocol.FieldError("description", "is longer than %d bytes", maxTextLength)
	}
	if len(s.Note) > maxTextLength {
		return nil, protocol.FieldError("note", "is longer than %d bytes", maxTextLength)
	}
	c := &compiled{id: s.ID, paused: s.Paused, start: math.MinInt64, end: math.MaxInt64,
		effectiveFrom: math.MinInt64}
	if !s.EffectiveFrom.IsZero() {
		c.effectiveFrom = s.EffectiveFrom.Unix()
	}
	if err := c.compileSpec(s); err != nil {
		return nil, err
	}
	if err := c.compileTarget(&s.Target); err != nil {
		return nil, err
	}
	if err := c.compilePolicy(&s.Policy); err != nil {
		return nil, err
	}
	if c.workflow && c.overlap == overlapCancelPrevious {
		return nil, protocol.FieldError("policy.overlap", "cancel_previous cancels a job, not a workflow run: use allow, skip or buffer_one")
	}
	if c.tmpl != nil && c.kind == kindTime {
		// Time triggers know their whole template data: run it once now.
		at := time.Date(2026, 1, 2, 3, 4, 5, 0, c.loc)
		if _, err := render(c.tmpl, &TemplateData{ScheduleID: c.id, JobID: jobID(c.id, at.Unix()), NominalTime: at, FireTime: at}); err != nil {
			return nil, protocol.FieldError("target.payload_template", "%v", err)
		}
	}
	return c, nil
}

func (c *compiled) compileSpec(s *jetfleet.Schedule) error {
	sp := &s.Spec
	field, err := sp.TriggerField()
	if err != nil {
		return err
	}
	if sp.Zone == "Local" {
		return protocol.FieldError("spec.zone", "name an IANA time zone such as Europe/Berlin; Local depends on the server")
	}
	loc, err := loadLocation(sp.Zone)
	if err != nil {
		return protocol.FieldError("spec.zone", "unknown time zone %q", sp.Zone)
	}
	c.loc = loc
	switch field {
	case "spec.cron":
		return c.compileCron(sp.Cron)
	case "spec.interval":
		iv := sp.Interval
		c.text = "every " + iv.Every.String()
		if err := validDuration("spec.interval.every", iv.Every, false); err != nil {
			return err
		}
		if iv.Every.D() < time.Second {
			return protocol.FieldError("spec.interval.every", "must be at least 1s, got %s", iv.Every.D())
		}
		if err := wholeSeconds("spec.interval.every", iv.Every.D()); err != nil {
			return err
		}
		if err := validDuration("spec.interval.phase", iv.Phase, true); err != nil {
			return err
		}
		if iv.Phase >= iv.Every {
			return protocol.FieldError("spec.interval.phase", "must be less than spec.interval.every")
		}
		if err := wholeSeconds("spec.interval.phase", iv.Phase.D()); err != nil {
			return err
		}
		if iv.Anchor.Nanosecond() != 0 {
			return protocol.FieldError("spec.interval.anchor", "must be a whole second")
		}
		anchor := int64(0)
		if !iv.Anchor.IsZero() {
			anchor = iv.Anchor.Unix()
		}
		c.trig = &intervalTrigger{origin: anchor + int64(iv.Phase.D()/time.Second), every: int64(iv.Every.D() / time.Second)}
	case "spec.at":
		if sp.At.IsZero() || sp.At.Nanosecond() != 0 {
			return protocol.FieldError("spec.at", "must be a time with whole seconds")
		}
		c.trig = &onceTrigger{at: sp.At.Unix()}
		c.text = "at " + sp.At.UTC().Format(time.RFC3339)
	case "spec.event":
		ev := sp.Event
		if err := validateSubjectFilter("spec.event.subject", ev.Subject); err != nil {
			return err
		}
		c.kind, c.stream, c.filters, c.startSeq = kindEvent, ev.Stream, []string{ev.Subject}, ev.StartSequence
		c.text = "event " + ev.Subject
	case "spec.after":
		return c.compileDependency(s.ID, sp.After)
	}
	return nil
}

func (c *compiled) compileCron(spec string) error {
	spec = strings.TrimSpace(spec)
	if strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ=") {
		return protocol.FieldError("spec.cron", "set the time zone in spec.zone, not in the cron spec")
	}
	parsed, err := cronParser.Parse(spec)
	if err != nil {
		return protocol.FieldError("spec.cron", "%v", err)
	}
	c.text = intern("cron " + spec)
	switch p := parsed.(type) {
	case *cron.SpecSchedule:
		civil := *p
		civil.Location = time.UTC
		c.trig = &cronTrigger{spec: civil, loc: c.loc}
	case cron.ConstantDelaySchedule:
		if p.Delay < time.Second || p.Delay%time.Second != 0 {
			return protocol.FieldError("spec.cron", "@every needs a whole number of seconds, at least 1s")
		}
		c.trig = &intervalTrigger{every: int64(p.Delay / time.Second)}
	default:
		return protocol.FieldError("spec.cron", "unsupported spec %q", spec)
	}
	return nil
}

func (c *compiled) compileDependency(self string, dep *jetfleet.Dependency) error {
	if len(dep.On) == 0 || len(dep.On) > 16 {
		return protocol.FieldError("spec.after.on", "list 1 to 16 upstreams")
	}
	filters := map[string]bool{}
	for i, u := range dep.On {
		f := fieldf("spec.after.on[%d]", i)
		switch {
		case u.ScheduleID != "" && (u.Queue != "" || u.Kind != ""):
			return protocol.FieldError(f, "set schedule_id, or kind (and optionally queue), not both")
		case u.ScheduleID != "":
			if err := protocol.ValidateToken("schedule id", u.ScheduleID); err != nil {
				return protocol.FieldError(f+".schedule_id", "%v", err)
			}
			if u.ScheduleID == self {
				return protocol.FieldError(f+".schedule_id", "a schedule cannot depend on itself")
			}
			filters[protocol.JobEventsOfType("*", "*", protocol.EventSucceeded)] = true
		case u.Kind != "":
			if err := protocol.ValidateToken("kind", u.Kind); err != nil {
				return protocol.FieldError(f+".kind", "%v", err)
			}
			queue := "*"
			if u.Queue != "" {
				if err := protocol.ValidateToken("queue", u.Queue); err != nil {
					return protocol.FieldError(f+".queue", "%v", err)
				}
				queue = u.Queue
			}
			filters[protocol.JobEventsOfType(queue, u.Kind, protocol.EventSucceeded)] = true
		default:
			return protocol.FieldError(f, "set schedule_id or kind")
		}
	}
	if err := validDuration("spec.after.window", dep.Window, true); err != nil {
		return err
	}
	window := dep.Window.D()
	if window == 0 {
		window = jetfleet.DefaultDependencyWindow
	}
	c.kind, c.stream, c.startSeq = kindDependency, protocol.StreamEvents, dep.StartSequence
	c.text = "after " + describeUpstreams(dep.On)
	c.upstreams = dep.On
	c.depWindow = int64(window / time.Second)
	// The wildcard filter makes the narrower ones redundant, and JetStream
	// refuses overlapping filters.
	wide := protocol.JobEventsOfType("*", "*", protocol.EventSucceeded)
	if filters[wide] {
		c.filters = []string{wide}
		return nil
	}
	for f := range filters {
		c.filters = append(c.filters, f)
	}
	return nil
}

func (c *compiled) compileTarget(t *jetfleet.Target) error {
	if t.Workflow != "" {
		if err := c.compileWorkflowTarget(t); err != nil {
			return err
		}
	} else if err := c.compileJobTarget(t); err != nil {
		return err
	}
	return c.compilePayload(t)
}

func (c *compiled) compileWorkflowTarget(t *jetfleet.Target) error {
	if err := protocol.ValidateWorkflowName("workflow", t.Workflow); err != nil {
		return protocol.FieldError("target.workflow", "%v", err)
	}
	for field, set := range map[string]bool{"target.queue": t.Queue != "", "target.kind": t.Kind != "",
		"target.timeout": t.Timeout != 0, "target.max_attempts": t.MaxAttempts != 0, "target.backoff": len(t.Backoff) > 0} {
		if set {
			return protocol.FieldError(field, "a workflow target takes none: its steps set their own")
		}
	}
	c.queue, c.kindName, c.workflow = protocol.WorkflowJobQueue, intern(t.Workflow), true
	return nil
}

func (c *compiled) compileJobTarget(t *jetfleet.Target) error {
	if err := protocol.ValidateToken("queue", t.Queue); err != nil {
		return protocol.FieldError("target.queue", "%v", err)
	}
	if err := protocol.ValidateToken("kind", t.Kind); err != nil {
		return protocol.FieldError("target.kind", "%v", err)
	}
	c.queue, c.kindName = intern(t.Queue), intern(t.Kind)
	return nil
}

func (c *compiled) compilePayload(t *jetfleet.Target) error {
	if len(t.Payload) > 0 && t.PayloadTemplate != "" {
		return protocol.FieldError("target.payload_template", "set target.payload or target.payload_template, not both")
	}
	if len(t.Payload) > 0 {
		var buf bytes.Buffer
		if err := json.Compact(&buf, t.Payload); err != nil {
			return protocol.FieldError("target.payload", "is not JSON: %v", err)
		}
		c.payload = bytes.Clone(buf.Bytes())
	}
	if t.PayloadTemplate != "" {
		tmpl, err := parseTemplate(t.PayloadTemplate)
		if err != nil {
			return protocol.FieldError("target.payload_template", "%v", err)
		}
		c.tmpl = tmpl
	}
	if err := validDuration("target.timeout", t.Timeout, true); err != nil {
		return err
	}
	c.timeout = t.Timeout.D()
	if t.MaxAttempts < 0 || t.MaxAttempts > math.MaxInt32 {
		return protocol.FieldError("target.max_attempts", "must be 0 (the agent's default) or more")
	}
	c.maxAttempts = int32(t.MaxAttempts)
	if len(t.Backoff) > 0 {
		delays := make([]time.Duration, len(t.Backoff))
		for i, d := range t.Backoff {
			if err := validDuration(fieldf("target.backoff[%d]", i), d, true); err != nil {
				return err
			}
			delays[i] = d.D()
		}
		c.backoff = intern(protocol.FormatBackoff(delays))
	}
	return nil
}

func (c *compiled) compilePolicy(p *jetfleet.Policy) error {
	switch p.Overlap {
	case "", jetfleet.OverlapAllow:
		c.overlap = overlapAllow
	case jetfleet.OverlapSkip:
		c.overlap = overlapSkip
	case jetfleet.OverlapBufferOne:
		c.overlap = overlapBufferOne
	case jetfleet.OverlapCancelPrevious:
		c.overlap = overlapCancelPrevious
	default:
		return protocol.FieldError("policy.overlap", "unknown policy %q: use allow, skip, buffer_one or cancel_previous", p.Overlap)
	}
	switch p.Misfire {
	case "", jetfleet.MisfireFireOnce:
		c.misfire = misfireFireOnce
	case jetfleet.MisfireFireAll:
		c.misfire = misfireFireAll
	case jetfleet.MisfireSkip:
		c.misfire = misfireSkip
	default:
		return protocol.FieldError("policy.misfire", "unknown policy %q: use fire_once, fire_all or skip", p.Misfire)
	}
	if err := validDuration("policy.catch_up_window", p.CatchUpWindow, true); err != nil {
		return err
	}
	window := p.CatchUpWindow.D()
	if window == 0 {
		window = jetfleet.DefaultCatchUpWindow
	}
	if window < time.Second {
		return protocol.FieldError("policy.catch_up_window", "must be at least 1s")
	}
	c.window = int64(window / time.Second)
	if p.MaxCatchUp < 0 || p.MaxCatchUp > jetfleet.MaxMaxCatchUp {
		return protocol.FieldError("policy.max_catch_up", "must be 0 (default %d) to %d", jetfleet.DefaultMaxCatchUp, jetfleet.MaxMaxCatchUp)
	}
	c.maxCatchUp = int32(p.MaxCatchUp)
	if c.maxCatchUp == 0 {
		c.maxCatchUp = jetfleet.DefaultMaxCatchUp
	}
	if err := validDuration("policy.jitter", p.Jitter, true); err != nil {
		return err
	}
	if p.Jitter.D() > 24*time.Hour {
		return protocol.FieldError("policy.jitter", "must be at most 24h")
	}
	c.jitter = int64(p.Jitter.D())
	if !p.StartAt.IsZero() {
		c.start = p.StartAt.Unix()
		if p.StartAt.Nanosecond() != 0 {
			c.start++ // nominal times are whole seconds: the first one not before StartAt
		}
	}
	if !p.EndAt.IsZero() {
		c.end = p.EndAt.Unix()
		if c.end < c.start {
			return protocol.FieldError("policy.end_at", "is before policy.start_at")
		}
	}
	return nil
}

// describe is the trigger in a few words, with its zone.
func (c *compiled) describe() string {
	if c.kind == kindTime && c.loc != time.UTC {
		return c.text + " (" + c.loc.String() + ")"
	}
	return c.text
}

func describeUpstreams(on []jetfleet.Upstream) string {
	parts := make([]string, len(on))
	for i, u := range on {
		switch {
		case u.ScheduleID != "":
			parts[i] = "schedule " + u.ScheduleID
		case u.Queue != "":
			parts[i] = u.Queue + "/" + u.Kind
		default:
			parts[i] = "*/" + u.Kind
		}
	}
	return strings.Join(parts, " and ")
}

// nextNominal is the first nominal time after after inside the schedule's
// bounds, for time triggers.
func (c *compiled) nextNominal(after int64) (int64, bool) {
	if c.kind != kindTime {
		return 0, false
	}
	if c.start > math.MinInt64 && after < c.start-1 {
		after = c.start - 1
	}
	t, ok := c.trig.next(after)
	if !ok || t > c.end {
		return 0, false
	}
	return t, true
}

// plannedAt is when the fire of nominal time t is due: t plus the
// schedule's jitter for t, in Unix nanoseconds.
func (c *compiled) plannedAt(t int64) int64 {
	ns := t * int64(time.Second)
	if c.jitter > 0 {
		ns += int64(jitterHash(c.id, t) % uint64(c.jitter))
	}
	return ns
}

// jitterHash is FNV-1a of the schedule id and the nominal time, so that
// every replica computes the same delay.
func jitterHash(id string, t int64) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= 1099511628211
	}
	for i := 0; i < 8; i++ {
		h ^= uint64(byte(t >> (8 * i)))
		h *= 1099511628211
	}
	return h
}

// interned shares the strings most schedules repeat (queues, kinds, backoff).
var interned = newInternTable()

func intern(s string) string { return interned.get(s) }
