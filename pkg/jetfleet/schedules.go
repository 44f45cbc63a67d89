package jetfleet

import "time"

// The scheduler's API: its wire types, and the Client's schedule methods.

// ScheduleState is what the leader records about a schedule in bucket
// schedule_state, under the schedule's id. Every write is revision-checked.
type ScheduleState struct {
	ScheduleID string `json:"schedule_id"`
	// LastNominal is the cursor of time triggers: every nominal time at or
	// before it was handled (fired, skipped or missed).
	LastNominal time.Time `json:"last_nominal,omitzero"`
	// LastFire is the latest fire.
	LastFire *ScheduleFire `json:"last_fire,omitempty"`
	// RunningJobID is the run not over yet (overlap policies other than
	// allow); RunningSequence is its sequence in the JOBS stream.
	RunningJobID    string `json:"running_job_id,omitempty"`
	RunningSequence uint64 `json:"running_sequence,omitempty"`
	// Buffered is the nominal time buffer_one keeps for after the running run.
	Buffered time.Time `json:"buffered,omitzero"`
	// EventSequence is the cursor of event and dependency triggers: the last
	// handled sequence of their stream.
	EventSequence uint64 `json:"event_sequence,omitempty"`
	// Pending are the fan-in groups of a dependency with several upstreams:
	// nominal time (Unix seconds) → bit set of the upstreams that succeeded.
	Pending map[string]uint32 `json:"pending,omitempty"`
	// Fires, Skips and Misses count decisions since the schedule was created.
	Fires  uint64 `json:"fires,omitempty"`
	Skips  uint64 `json:"skips,omitempty"`
	Misses uint64 `json:"misses,omitempty"`
	// Done is set once no nominal time is left (a one-shot fired, or the
	// end bound passed).
	Done      bool      `json:"done,omitempty"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
}

// ScheduleFire describes one published job.
type ScheduleFire struct {
	JobID       string    `json:"job_id"`
	NominalTime time.Time `json:"nominal_time"`
	FiredAt     time.Time `json:"fired_at"`
}

// ScheduleUpdateRequest replaces a schedule's description, spec, target and policy
// (pause state changes only through pause and resume). A non-zero Revision
// must match the stored one.
type ScheduleUpdateRequest struct {
	Schedule
	Revision uint64 `json:"revision,omitempty"`
}

// ScheduleIDRequest names a schedule (get, rm, resume, trigger).
type ScheduleIDRequest struct {
	ID string `json:"id"`
}

// SchedulePauseRequest pauses a schedule with a note.
type SchedulePauseRequest struct {
	ID   string `json:"id"`
	Note string `json:"note,omitempty"`
}

// ScheduleListRequest pages through the schedules by id.
type ScheduleListRequest struct {
	// After is the last id of the previous page.
	After string `json:"after,omitempty"`
	// Limit defaults to 100; at most 1000.
	Limit int `json:"limit,omitempty"`
}

// ScheduleListResponse is one page of schedules; Next is the After of the next
// page, empty on the last one.
type ScheduleListResponse struct {
	Schedules []ScheduleSummary `json:"schedules"`
	Next      string            `json:"next,omitempty"`
}

// ScheduleSummary is a schedule in a listing.
type ScheduleSummary struct {
	ID       string     `json:"id"`
	Trigger  string     `json:"trigger"`
	Queue    string     `json:"queue"`
	Kind     string     `json:"kind"`
	Paused   bool       `json:"paused,omitempty"`
	NextFire *time.Time `json:"next_fire,omitempty"`
	LastFire *time.Time `json:"last_fire,omitempty"`
	Running  string     `json:"running_job_id,omitempty"`
}

// ScheduleInfo is a schedule with its revision and state.
type ScheduleInfo struct {
	Schedule *Schedule      `json:"schedule"`
	Revision uint64         `json:"revision"`
	State    *ScheduleState `json:"state,omitempty"`
	// NextFires are the next nominal times (up to 3) in the schedule's zone.
	NextFires []time.Time `json:"next_fires,omitempty"`
}

// TriggerResponse says what a trigger did: fired, skipped or buffered.
type TriggerResponse struct {
	JobID       string    `json:"job_id"`
	NominalTime time.Time `json:"nominal_time"`
	Outcome     string    `json:"outcome"`
	Reason      string    `json:"reason,omitempty"`
	Duplicate   bool      `json:"duplicate,omitempty"`
}

// PreviewRequest asks for the next Count nominal times at or after From
// (default now) of a stored schedule (ID) or of a definition not stored yet.
type PreviewRequest struct {
	ID       string    `json:"id,omitempty"`
	Schedule *Schedule `json:"schedule,omitempty"`
	From     time.Time `json:"from,omitzero"`
	// Count defaults to 10; at most 1000.
	Count int `json:"count,omitempty"`
}

// PreviewResponse lists nominal times in the schedule's zone.
type PreviewResponse struct {
	Zone  string      `json:"zone"`
	Times []time.Time `json:"times"`
}

// BackfillRequest fires every nominal time in [From, To] (To not in the
// future), oldest first, regardless of the overlap policy. Each fire has the
// job id of its nominal time, so times that already fired inside the JOBS
// duplicate window are not published again.
type BackfillRequest struct {
	ID   string    `json:"id"`
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// Max bounds the fires; defaults to, and is capped by, scheduler.max_backfill.
	Max int `json:"max,omitempty"`
}

// BackfillResponse counts what a backfill published.
type BackfillResponse struct {
	Fired      int       `json:"fired"`
	Duplicates int       `json:"duplicates"`
	First      time.Time `json:"first,omitzero"`
	Last       time.Time `json:"last,omitzero"`
	// Truncated is true when nominal times after Last were left out (Max).
	Truncated bool `json:"truncated,omitempty"`
}
