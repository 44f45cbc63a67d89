package topology

import (
	"errors"
	"time"

	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Config is the JetStream layout every service provisions. Keep it the same
// in every service of a fleet (the shipped config/fleet.yaml is shared);
// a service whose settings differ updates what is safe to update and refuses
// the rest. Zero values mean the documented default.
type Config struct {
	// Replicas of every stream and bucket. Defaults to 1; use 3 in a cluster.
	Replicas int `koanf:"replicas"`
	// Storage is file or memory. Defaults to file.
	Storage string `koanf:"storage"`
	// DuplicateWindow of the JOBS stream: a job published again with the
	// same Nats-Msg-Id inside it is dropped. Defaults to 10m.
	DuplicateWindow time.Duration `koanf:"duplicate_window"`
	// MaxJobSize bounds a job message (body and headers). A dead letter
	// carries the payload base64-encoded with its metadata, so it must fit
	// the server's max_payload: at most (max_payload − 96KiB) × 3/4, 696KiB
	// for the default 1MiB. Defaults to 512KiB.
	MaxJobSize config.ByteSize `koanf:"max_job_size"`
	// MaxQueuedJobs bounds the JOBS stream; publishes beyond it fail. Defaults to unlimited (0).
	MaxQueuedJobs int64 `koanf:"max_queued_jobs"`
	// DLQMaxAge keeps dead letters this long. Defaults to 720h (30 days).
	DLQMaxAge time.Duration `koanf:"dlq_max_age"`
	// DLQMaxBytes bounds the DLQ stream; the oldest letters go first. Defaults to unlimited (0).
	DLQMaxBytes config.ByteSize `koanf:"dlq_max_bytes"`
	// EventsMaxAge keeps job and schedule events — and so the status of a
	// job, its latest event — this long. Defaults to 168h (7 days).
	EventsMaxAge time.Duration `koanf:"events_max_age"`
	// EventsMaxBytes bounds the EVENTS stream. Defaults to unlimited (0).
	EventsMaxBytes config.ByteSize `koanf:"events_max_bytes"`
	// EventBatches is how agents batch their events: "fast" (JetStream
	// fast batches) or "atomic" (atomic batches, EVENTS allow_atomic). With
	// sync_interval: always, one server syncs an atomic batch once and a
	// fast batch once per event, so use atomic there; with the default
	// interval fast batches cost less CPU (docs/performance.md, Durability).
	// Agents read it from the stream when they start. Defaults to fast.
	EventBatches string `koanf:"event_batches"`
	// LeaseTTL is how long a leader lease lives without renewal. Defaults to 5s.
	LeaseTTL time.Duration `koanf:"lease_ttl"`
	// AgentTTL is how long an agent stays registered without a heartbeat. Defaults to 15s.
	AgentTTL time.Duration `koanf:"agent_ttl"`
	// CancelTTL is how long a cancel requested for a job that is not
	// running (queued, delayed, waiting for a retry) waits in bucket cancels
	// for an agent to receive the job. Defaults to 168h (7 days).
	CancelTTL time.Duration `koanf:"cancel_ttl"`
	// WorkflowRunTTL is how long a workflow run's state is kept in bucket
	// workflow_runs after its last change (its end, for an ended run).
	// Defaults to 720h (30 days).
	WorkflowRunTTL time.Duration `koanf:"workflow_run_ttl"`
	// Queues configures the consumer of each queue; queues not listed use DefaultQueue.
	Queues map[string]QueueConfig `koanf:"queues"`
	// VerifyOnly makes a service check that the streams and buckets exist
	// instead of creating or updating them, waiting up to a minute for a
	// service that may (the scheduler or the supervisor) to create them.
	// For services whose NATS user must not manage streams, such as agents;
	// an agent still creates its queue's consumer. Defaults to false.
	VerifyOnly bool `koanf:"verify_only"`
	// AllowDestructiveUpdates lets provisioning lower limits of existing
	// streams and buckets (which can delete stored messages). Defaults to false:
	// such a change is refused with an error.
	AllowDestructiveUpdates bool `koanf:"allow_destructive_updates"`
}

// QueueConfig configures the durable consumer of one queue.
type QueueConfig struct {
	// AckWait is how long a delivered job may go without an ack or progress
	// before JetStream redelivers it. Defaults to 30s.
	AckWait time.Duration `koanf:"ack_wait"`
	// MaxDeliver bounds deliveries of one job, counting crashes and snoozes;
	// past it the supervisor dead-letters the job. Defaults to 20.
	MaxDeliver int `koanf:"max_deliver"`
	// MaxAckPending bounds jobs in flight on the queue across the fleet. Defaults to 10000.
	MaxAckPending int `koanf:"max_ack_pending"`
}

// Defaults of Config and QueueConfig.
const (
	DefaultReplicas        = 1
	DefaultStorage         = "file"
	EventBatchesFast       = "fast"
	EventBatchesAtomic     = "atomic"
	DefaultDuplicateWindow = 10 * time.Minute
	DefaultMaxJobSize      = 512 << 10
	DefaultDLQMaxAge       = 30 * 24 * time.Hour
	DefaultEventsMaxAge    = 7 * 24 * time.Hour
	DefaultLeaseTTL        = 5 * time.Second
	DefaultAgentTTL        = 15 * time.Second
	DefaultCancelTTL       = 7 * 24 * time.Hour
	DefaultWorkflowRunTTL  = 30 * 24 * time.Hour
	DefaultAckWait         = 30 * time.Second
	DefaultMaxDeliver      = 20
	DefaultMaxAckPending   = 10000
)

// WithDefaults returns c with every zero value replaced by its default.
func (c Config) WithDefaults() Config {
	setDefault(&c.Replicas, DefaultReplicas)
	setDefault(&c.Storage, DefaultStorage)
	setDefault(&c.EventBatches, EventBatchesFast)
	setDefault(&c.DuplicateWindow, DefaultDuplicateWindow)
	setDefault(&c.MaxJobSize, DefaultMaxJobSize)
	setDefault(&c.DLQMaxAge, DefaultDLQMaxAge)
	setDefault(&c.EventsMaxAge, DefaultEventsMaxAge)
	setDefault(&c.LeaseTTL, DefaultLeaseTTL)
	setDefault(&c.AgentTTL, DefaultAgentTTL)
	setDefault(&c.CancelTTL, DefaultCancelTTL)
	setDefault(&c.WorkflowRunTTL, DefaultWorkflowRunTTL)
	queues := make(map[string]QueueConfig, len(c.Queues))
	for name, q := range c.Queues {
		queues[name] = q.WithDefaults()
	}
	c.Queues = queues
	return c
}

// WithDefaults returns q with every zero value replaced by its default.
func (q QueueConfig) WithDefaults() QueueConfig {
	setDefault(&q.AckWait, DefaultAckWait)
	setDefault(&q.MaxDeliver, DefaultMaxDeliver)
	setDefault(&q.MaxAckPending, DefaultMaxAckPending)
	return q
}

// Queue returns the consumer settings of queue.
func (c Config) Queue(queue string) QueueConfig {
	return c.Queues[queue].WithDefaults()
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// deadLetterOverhead is what a dead letter adds to a job's base64-encoded
// payload at most: headers, last error and output tail (both bounded) and
// the document's own fields.
const deadLetterOverhead = 96 << 10

// MaxJobSizeFor is the largest max_job_size whose dead letters fit a
// server's max_payload.
func MaxJobSizeFor(serverMaxPayload int64) int64 {
	return (serverMaxPayload - deadLetterOverhead) * 3 / 4
}

// CheckServer refuses a max_job_size whose dead letters would not fit the
// server's max_payload: such a job could never be dead-lettered.
func (c Config) CheckServer(serverMaxPayload int64) error {
	size := int64(c.WithDefaults().MaxJobSize)
	if limit := MaxJobSizeFor(serverMaxPayload); size > limit {
		return config.Invalid("topology.max_job_size",
			"%s is too large for the server's max_payload of %s: a dead letter carries the payload base64-encoded with its metadata, so it must be at most %s (or raise max_payload in the server's configuration)",
			config.ByteSize(size), config.ByteSize(serverMaxPayload), config.ByteSize(limit))
	}
	return nil
}

// Validate checks c; keys are reported below section (for example "topology").
func (c Config) Validate(section string) error {
	var errs []error
	key := func(k string) string { return section + "." + k }
	if c.Replicas < 0 || c.Replicas > 5 {
		errs = append(errs, config.Invalid(key("replicas"), "must be 1 to 5, got %d", c.Replicas))
	}
	if c.Storage != "" && c.Storage != "file" && c.Storage != "memory" {
		errs = append(errs, config.Invalid(key("storage"), "must be file or memory, got %q", c.Storage))
	}
	if c.EventBatches != "" && c.EventBatches != EventBatchesFast && c.EventBatches != EventBatchesAtomic {
		errs = append(errs, config.Invalid(key("event_batches"), "must be fast or atomic, got %q", c.EventBatches))
	}
	for k, d := range map[string]time.Duration{
		"duplicate_window": c.DuplicateWindow, "dlq_max_age": c.DLQMaxAge, "events_max_age": c.EventsMaxAge,
		"lease_ttl": c.LeaseTTL, "agent_ttl": c.AgentTTL, "cancel_ttl": c.CancelTTL,
		"workflow_run_ttl": c.WorkflowRunTTL,
	} {
		if d < 0 {
			errs = append(errs, config.Invalid(key(k), "must not be negative, got %s", d))
		}
	}
	if c.LeaseTTL != 0 && c.LeaseTTL < time.Second {
		errs = append(errs, config.Invalid(key("lease_ttl"), "must be at least 1s, got %s", c.LeaseTTL))
	}
	if c.MaxJobSize < 0 || c.MaxJobSize > 64<<20 {
		errs = append(errs, config.Invalid(key("max_job_size"), "must be at most 64MiB"))
	}
	if c.MaxQueuedJobs < 0 {
		errs = append(errs, config.Invalid(key("max_queued_jobs"), "must not be negative"))
	}
	for name, q := range c.Queues {
		qkey := func(k string) string { return key("queues." + name + "." + k) }
		if err := protocol.ValidateToken("queue", name); err != nil {
			errs = append(errs, config.Invalid(key("queues."+name), "%v", err))
		}
		if q.AckWait < 0 || (q.AckWait > 0 && q.AckWait < time.Second) {
			errs = append(errs, config.Invalid(qkey("ack_wait"), "must be at least 1s, got %s", q.AckWait))
		}
		if q.MaxDeliver < 0 {
			errs = append(errs, config.Invalid(qkey("max_deliver"), "must not be negative"))
		}
		if q.MaxAckPending < 0 {
			errs = append(errs, config.Invalid(qkey("max_ack_pending"), "must not be negative"))
		}
	}
	return errors.Join(errs...)
}
