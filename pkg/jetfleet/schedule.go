package jetfleet

import (
	"encoding/json"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Schedule is a schedule definition: when to fire (Spec), what to publish
// (Target) and how to behave when runs overlap or were missed (Policy). It is
// stored as JSON in bucket schedules under its ID and is the document the API
// takes and returns. Fields marked "set by the scheduler" are ignored on input.
type Schedule struct {
	// ID names the schedule: 1 to 128 letters, digits, '-' or '_'.
	ID          string `json:"id"`
	Description string `json:"description,omitempty"`
	Spec        Spec   `json:"spec"`
	Target      Target `json:"target"`
	Policy      Policy `json:"policy,omitzero"`
	// Paused schedules do not fire; Note says why.
	Paused bool   `json:"paused,omitempty"`
	Note   string `json:"note,omitempty"`

	// CreatedAt and UpdatedAt are set by the scheduler.
	CreatedAt time.Time `json:"created_at,omitzero"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
	// EffectiveFrom is set by the scheduler when the schedule is created,
	// its trigger changes or it is resumed: nominal times at or before it are
	// never fired by the timer (nor caught up).
	EffectiveFrom time.Time `json:"effective_from,omitzero"`
}

// Spec says when a schedule fires. Set exactly one of Cron, Interval, At,
// Event and After.
type Spec struct {
	// Cron is a cron spec of 5 fields (minute hour day-of-month month
	// day-of-week), 6 fields (with seconds first), or a descriptor: @yearly,
	// @monthly, @weekly, @daily, @hourly, or @every <duration>, which is an
	// interval anchored at the Unix epoch.
	Cron string `json:"cron,omitempty"`
	// Zone is the IANA time zone of Cron (and of times shown by preview).
	// Defaults to UTC.
	Zone string `json:"zone,omitempty"`
	// Interval fires every Every, at Anchor + Phase + k·Every.
	Interval *Interval `json:"interval,omitempty"`
	// At fires once at this time.
	At *time.Time `json:"at,omitempty"`
	// Event fires once for every message stored on a subject.
	Event *EventSpec `json:"event,omitempty"`
	// After fires when upstream runs succeed.
	After *Dependency `json:"after,omitempty"`
}

// Interval is a fixed-rate trigger.
type Interval struct {
	// Every is the period: a whole number of seconds, at least 1s.
	Every Duration `json:"every"`
	// Phase shifts the fire times: 0 ≤ Phase < Every, whole seconds.
	Phase Duration `json:"phase,omitempty"`
	// Anchor is a fire time (before the phase). Defaults to the Unix epoch,
	// so every: 1h fires on the hour in UTC.
	Anchor time.Time `json:"anchor,omitzero"`
}

// EventSpec fires a job for every message stored on Subject. The message's
// payload becomes the job's payload unless the target sets a payload or a
// payload template (which sees the message as .Event).
type EventSpec struct {
	// Subject is a subject filter, wildcards allowed; a stream must capture it.
	Subject string `json:"subject"`
	// Stream that captures Subject; set by the scheduler when empty.
	Stream string `json:"stream,omitempty"`
	// StartSequence is set by the scheduler: messages at or before it (stored
	// before the schedule was created, its trigger changed or it was resumed)
	// do not fire.
	StartSequence uint64 `json:"start_sequence,omitempty"`
}

// Dependency fires after upstream runs succeed. With one upstream, every
// succeeded run fires once. With several, a run fires once all of them have
// succeeded for the same nominal time (fan-in); only scheduled runs, which
// carry a nominal time, take part in a fan-in.
type Dependency struct {
	// On lists the upstreams (1 to 16).
	On []Upstream `json:"on"`
	// Window is how long a fan-in waits for the rest of its upstreams after
	// the first one succeeded. Defaults to 24h.
	Window Duration `json:"window,omitempty"`
	// StartSequence is set by the scheduler: job events stored at or before
	// it do not count.
	StartSequence uint64 `json:"start_sequence,omitempty"`
}

// Upstream is a schedule (its runs) or a job kind (in a queue, or in any
// queue when Queue is empty).
type Upstream struct {
	ScheduleID string `json:"schedule_id,omitempty"`
	Queue      string `json:"queue,omitempty"`
	Kind       string `json:"kind,omitempty"`
}

// Target is the job a fire publishes on jobs.<queue>.<kind>, or the
// workflow whose run it starts.
type Target struct {
	Queue string `json:"queue,omitempty"`
	Kind  string `json:"kind,omitempty"`
	// Workflow, instead of Queue and Kind, makes a fire start a run of the
	// stored workflow of that name (docs/workflows.md): a message on
	// workflows.<workflow> whose body, the payload, is the run's input. The
	// run stands for the fire's job: its end is the job's succeeded, dead or
	// cancelled event. Timeout, MaxAttempts and Backoff are the steps' then.
	Workflow string `json:"workflow,omitempty"`
	// Payload is the job's body, any JSON value, written as is.
	Payload json.RawMessage `json:"payload,omitempty"`
	// PayloadTemplate is a Go text/template producing the body; see
	// docs/scheduling.md for its data and functions. Exclusive with Payload.
	PayloadTemplate string `json:"payload_template,omitempty"`
	// Timeout, MaxAttempts and Backoff become the job's Jetfleet-Timeout,
	// Jetfleet-Max-Attempts and Jetfleet-Backoff headers; zero leaves the
	// agent's defaults.
	Timeout     Duration   `json:"timeout,omitempty"`
	MaxAttempts int        `json:"max_attempts,omitempty"`
	Backoff     []Duration `json:"backoff,omitempty"`
}

// Overlap policies: what a fire does while the schedule's previous run is
// not over (no succeeded or dead event yet).
const (
	// OverlapAllow fires regardless. The default.
	OverlapAllow = "allow"
	// OverlapSkip skips the fire (event skipped, reason overlap).
	OverlapSkip = "skip"
	// OverlapBufferOne keeps one fire until the previous run is over and
	// skips further ones.
	OverlapBufferOne = "buffer_one"
	// OverlapCancelPrevious cancels the previous run and fires.
	OverlapCancelPrevious = "cancel_previous"
)

// Misfire policies: what happens to nominal times that passed more than
// the scheduler's misfire threshold ago (downtime) but inside the catch-up
// window.
const (
	// MisfireFireOnce fires one run for all of them (the latest), unless a
	// run on time follows. The default.
	MisfireFireOnce = "fire_once"
	// MisfireFireAll fires each of them, at most Policy.MaxCatchUp (the latest).
	MisfireFireAll = "fire_all"
	// MisfireSkip fires none of them.
	MisfireSkip = "skip"
)

// Defaults of Policy and Dependency.
const (
	DefaultCatchUpWindow    = 24 * time.Hour
	DefaultMaxCatchUp       = 100
	MaxMaxCatchUp           = 10_000
	DefaultDependencyWindow = 24 * time.Hour
)

// Policy is a schedule's behaviour around its fires.
type Policy struct {
	// Overlap is allow (default), skip, buffer_one or cancel_previous.
	Overlap string `json:"overlap,omitempty"`
	// CatchUpWindow is how far back a missed nominal time may still fire
	// after downtime; older ones are reported missed. Defaults to 24h.
	CatchUpWindow Duration `json:"catch_up_window,omitempty"`
	// Misfire is fire_once (default), fire_all or skip.
	Misfire string `json:"misfire,omitempty"`
	// MaxCatchUp bounds fire_all. Defaults to 100; at most 10,000.
	MaxCatchUp int `json:"max_catch_up,omitempty"`
	// Jitter delays each fire by a pseudo-random amount in [0, Jitter),
	// fixed per nominal time so that every replica agrees.
	Jitter Duration `json:"jitter,omitempty"`
	// StartAt and EndAt bound the nominal times (inclusive).
	StartAt time.Time `json:"start_at,omitzero"`
	EndAt   time.Time `json:"end_at,omitzero"`
}

// TriggerField names the trigger set in sp (spec.cron, spec.interval, …), or
// returns an error naming the field spec when none or several are set.
func (sp *Spec) TriggerField() (string, error) {
	var set []string
	if sp.Cron != "" {
		set = append(set, "spec.cron")
	}
	if sp.Interval != nil {
		set = append(set, "spec.interval")
	}
	if sp.At != nil {
		set = append(set, "spec.at")
	}
	if sp.Event != nil {
		set = append(set, "spec.event")
	}
	if sp.After != nil {
		set = append(set, "spec.after")
	}
	if len(set) != 1 {
		return "", protocol.FieldError("spec", "set exactly one of spec.cron, spec.interval, spec.at, spec.event and spec.after (got %d)", len(set))
	}
	return set[0], nil
}

// DecodeSchedule reads a schedule document, reporting a field that has the
// wrong type as an invalid_argument error naming it.
func DecodeSchedule(data []byte) (*Schedule, error) {
	var s Schedule
	if err := protocol.DecodeDocument(data, &s); err != nil {
		return nil, err
	}
	return &s, nil
}
