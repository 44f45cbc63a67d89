package dashboard

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// filter is what a list page's URL asks for. Every list has a URL that can
// be shared: the filter is its query string.
type filter struct {
	State      string
	Queue      string
	Kind       string
	Reason     string
	JobID      string
	ScheduleID string
	AgentID    string
	// Q matches schedule ids by substring.
	Q string
	// Paused: "" (all), "yes" or "no".
	Paused string
	Since  time.Time
	Until  time.Time
	// Cursor (numeric) or After (an id) continue a list.
	Cursor uint64
	After  string
	Limit  int
}

// queryError is a malformed filter: the page answers 400 with the reason.
type queryError struct {
	Field  string
	Reason string
}

func (e *queryError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }

// parseFilter reads the filter of a list page from q, accepting only the
// keys in allowed; maxLimit bounds limit. Times are RFC 3339, or a
// duration ("1h", "30m") meaning that long before now.
func parseFilter(q url.Values, now time.Time, maxLimit int, allowed ...string) (filter, error) {
	var f filter
	ok := map[string]bool{"fragment": true}
	for _, k := range allowed {
		ok[k] = true
	}
	for k, vs := range q {
		if !ok[k] {
			return f, &queryError{k, "is not a filter of this page"}
		}
		if len(vs) > 1 {
			return f, &queryError{k, "is given more than once"}
		}
	}
	token := func(key, what string, dst *string) error {
		v := strings.TrimSpace(q.Get(key))
		if v == "" {
			return nil
		}
		if err := protocol.ValidateToken(what, v); err != nil {
			return &queryError{key, err.Error()}
		}
		*dst = v
		return nil
	}
	for _, t := range []struct {
		key, what string
		dst       *string
	}{{"queue", "queue", &f.Queue}, {"kind", "kind", &f.Kind}, {"schedule", "schedule id", &f.ScheduleID}, {"agent", "agent id", &f.AgentID}} {
		if err := token(t.key, t.what, t.dst); err != nil {
			return f, err
		}
	}
	if v := strings.TrimSpace(q.Get("state")); v != "" {
		if !jetfleet.ValidJobState(v) {
			return f, &queryError{"state", fmt.Sprintf("must be one of %s; got %q", strings.Join(jetfleet.JobStates, ", "), v)}
		}
		f.State = v
	}
	if v := strings.TrimSpace(q.Get("reason")); v != "" {
		if len(v) > 64 || strings.ContainsAny(v, " \t\r\n") {
			return f, &queryError{"reason", "must be one word such as max_attempts"}
		}
		f.Reason = v
	}
	if v := strings.TrimSpace(q.Get("job")); v != "" {
		if err := protocol.ValidateJobID(v); err != nil {
			return f, &queryError{"job", err.Error()}
		}
		f.JobID = v
	}
	if v := q.Get("q"); v != "" {
		if len(v) > 128 {
			return f, &queryError{"q", "is longer than 128 characters"}
		}
		f.Q = strings.TrimSpace(v)
	}
	switch v := q.Get("paused"); v {
	case "", "yes", "no":
		f.Paused = v
	default:
		return f, &queryError{"paused", fmt.Sprintf("must be yes or no; got %q", v)}
	}
	var err error
	if f.Since, err = parseTime(q.Get("since"), now); err != nil {
		return f, &queryError{"since", err.Error()}
	}
	if f.Until, err = parseTime(q.Get("until"), now); err != nil {
		return f, &queryError{"until", err.Error()}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && f.Until.Before(f.Since) {
		return f, &queryError{"until", "is before since"}
	}
	if v := q.Get("cursor"); v != "" {
		if f.Cursor, err = strconv.ParseUint(v, 10, 64); err != nil {
			return f, &queryError{"cursor", "must be a whole number"}
		}
	}
	if v := q.Get("after"); v != "" {
		if err := protocol.ValidateToken("id", v); err != nil {
			return f, &queryError{"after", err.Error()}
		}
		f.After = v
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			return f, &queryError{"limit", fmt.Sprintf("must be a number from 1 to %d", maxLimit)}
		}
		f.Limit = n
	}
	return f, nil
}

// parseTime reads an RFC 3339 time, a date (2006-01-02), a datetime-local
// value (2006-01-02T15:04) or a duration before now.
func parseTime(v string, now time.Time) (time.Time, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 || d > 100*365*24*time.Hour {
			return time.Time{}, fmt.Errorf("a duration must be positive, such as 1h")
		}
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("must be a time (RFC 3339, e.g. 2026-11-25T10:00:00Z) or a duration before now (e.g. 1h); got %q", v)
}

// values writes f back as a query (for links that keep the filter).
func (f filter) values() url.Values {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("state", f.State)
	set("queue", f.Queue)
	set("kind", f.Kind)
	set("reason", f.Reason)
	set("job", f.JobID)
	set("schedule", f.ScheduleID)
	set("agent", f.AgentID)
	set("q", f.Q)
	set("paused", f.Paused)
	if !f.Since.IsZero() {
		set("since", f.Since.UTC().Format(time.RFC3339))
	}
	if !f.Until.IsZero() {
		set("until", f.Until.UTC().Format(time.RFC3339))
	}
	if f.Limit > 0 {
		set("limit", strconv.Itoa(f.Limit))
	}
	return q
}
