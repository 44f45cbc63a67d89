package scheduler

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"
	"text/template"
	"time"
)

// TemplateData is what a payload template sees.
type TemplateData struct {
	ScheduleID string
	JobID      string
	// NominalTime is the time the run is for, in the schedule's zone.
	NominalTime time.Time
	// FireTime is when the fire was due: the nominal time plus jitter.
	FireTime time.Time
	// Event is the message of an event-triggered fire.
	Event *EventData
	// Upstream is the job event that completed a dependency.
	Upstream *UpstreamData
}

// EventData is the message that triggered an event schedule.
type EventData struct {
	Subject  string
	Sequence uint64
	Time     time.Time
	Header   map[string][]string
	// Data is the payload as text; JSON is the payload parsed as JSON (nil
	// when it is not JSON).
	Data string
	JSON any
}

// UpstreamData is the succeeded run that completed a dependency.
type UpstreamData struct {
	JobID       string
	Queue       string
	Kind        string
	ScheduleID  string
	NominalTime time.Time
}

var templateFuncs = template.FuncMap{
	// json writes v as JSON: {"when":{{json .NominalTime}}}.
	"json": func(v any) (string, error) {
		b, err := json.Marshal(v)
		return string(b), err
	},
	// unix is a time as Unix seconds.
	"unix": func(t time.Time) int64 { return t.Unix() },
	// rfc3339 formats a time as RFC 3339 in its own zone.
	"rfc3339": func(t time.Time) string { return t.Format(time.RFC3339) },
}

// templates caches parsed templates by text: many schedules share one.
var templates sync.Map // text → *template.Template

func parseTemplate(text string) (*template.Template, error) {
	if t, ok := templates.Load(text); ok {
		return t.(*template.Template), nil
	}
	t, err := template.New("payload").Option("missingkey=error").Funcs(templateFuncs).Parse(text)
	if err != nil {
		return nil, err
	}
	actual, _ := templates.LoadOrStore(text, t)
	return actual.(*template.Template), nil
}

func render(t *template.Template, data *TemplateData) ([]byte, error) {
	var buf bytes.Buffer
	if err := t.Execute(&buf, data); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// internTable shares equal strings, up to a bound so that arbitrary input
// cannot grow it without limit.
type internTable struct {
	mu sync.Mutex
	m  map[string]string
}

func newInternTable() *internTable { return &internTable{m: map[string]string{}} }

const maxInterned = 10_000

func (t *internTable) get(s string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if v, ok := t.m[s]; ok {
		return v
	}
	if len(t.m) < maxInterned {
		t.m[s] = s
	}
	return s
}

func jobID(scheduleID string, nominal int64) string {
	return fmt.Sprintf("sched.%s.%d", scheduleID, nominal)
}
