package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

func init() {
	register(&command{name: "submit", args: "<queue> <kind> [payload|-]", summary: "publish a job: submit <queue> <kind> [payload|-]",
		help: "Publishes one job to jobs.<queue>.<kind> and waits for JetStream to store it. The payload is the\n" +
			"third argument, or standard input when it is '-' (a payload starting with '-' goes after '--').\n" +
			"A JSON payload is published through the Go client (pkg/jetfleet's Enqueue), which writes it\n" +
			"compacted: the same JSON value, insignificant spaces dropped and <, > and & escaped as \\u003c…;\n" +
			"any other payload (text, binary, none) is published byte for byte.\n\n" +
			"The job carries a W3C traceparent: submit starts a span (jetfleet submit) around the producer span\n" +
			"(jetfleet.enqueue <kind>) that the agent's execution span continues, and prints the trace id. With\n" +
			"OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set, the spans are exported over\n" +
			"OTLP/HTTP, as the services export theirs.",
		fleet: true, output: true, setup: setupSubmit})
}

type headerFlag struct{ h nats.Header }

func (f *headerFlag) String() string { return "" }
func (f *headerFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want name=value, got %q", v)
	}
	f.h.Add(k, val)
	return nil
}

// rawArgs are the arguments of a job submitted from the command line: its
// kind and its payload, already JSON. They satisfy jetfleet.Args, and
// encoding/json takes their MarshalJSON output as the payload (compacted).
type rawArgs struct {
	kind    string
	payload []byte
}

func (a rawArgs) Kind() string                 { return a.kind }
func (a rawArgs) MarshalJSON() ([]byte, error) { return a.payload, nil }

// submitted is what submit prints with -o json.
type submitted struct {
	jetfleet.EnqueueResult
	Subject string `json:"subject"`
	Stream  string `json:"stream"`
	TraceID string `json:"trace_id"`
}

func setupSubmit(fs *flag.FlagSet) action {
	var job protocol.Job
	fs.StringVar(&job.ID, "id", "", "job `id`, also the idempotency key (default a unique id)")
	fs.DurationVar(&job.Timeout, "job-timeout", 0, "bound on one attempt (Jetfleet-Timeout)")
	fs.IntVar(&job.MaxAttempts, "max-attempts", 0, "attempts before the job is dead-lettered")
	backoff := fs.String("backoff", "", "retry delays, comma-separated (1s,10s,1m)")
	headers := &headerFlag{h: nats.Header{}}
	fs.Var(headers, "header", "extra header `name=value` (repeatable)")
	fs.StringVar(&job.Priority, "priority", "", "the job's `priority` in its queue: high, default or low")
	at := fs.String("at", "", "run the job at this `time` (RFC 3339, e.g. 2026-11-25T18:00:00Z): a delayed job")
	in := fs.Duration("in", 0, "run the job after this `duration` (e.g. 90s): a delayed job")
	uniqueKey := fs.String("unique-key", "", "unique `key` of the job in its queue and kind: while another job holds it, nothing is published\n"+
		"and that job's id is printed (needs -unique-for or -unique-until-finished, and a JSON payload)")
	uniqueFor := fs.Duration("unique-for", 0, "hold -unique-key for this `period` (at least 1s); with -unique-until-finished, at most this long")
	uniqueUntil := fs.Bool("unique-until-finished", false, "hold -unique-key until the job succeeded, was dead-lettered or cancelled")
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(2, "the <queue>", "the <kind>", "the [payload]"); err != nil {
			return err
		}
		job.Queue, job.Kind, job.Header = inv.args[0], inv.args[1], headers.h
		if err := protocol.ValidatePriority(job.Priority); err != nil {
			return flagValueErrorf("-priority: %v", err)
		}
		switch {
		case *at != "" && *in != 0:
			return flagValueErrorf("give -at or -in, not both")
		case *at != "":
			t, err := time.Parse(time.RFC3339Nano, *at)
			if err != nil {
				return flagValueErrorf("-at %q is not an RFC 3339 time such as 2026-11-25T18:00:00Z", *at)
			}
			job.ProcessAt = t
		case *in < 0:
			return flagValueErrorf("-in %s is negative", *in)
		case *in > 0:
			job.ProcessAt = time.Now().Add(*in)
		}
		if *uniqueKey != "" || *uniqueFor != 0 || *uniqueUntil {
			u := protocol.Unique{Key: *uniqueKey, For: *uniqueFor, UntilFinished: *uniqueUntil}
			if err := u.Validate(); err != nil {
				return flagValueErrorf("-unique-key, -unique-for, -unique-until-finished: %v", err)
			}
			job.Unique = &u
		}
		if *backoff != "" {
			b, err := protocol.ParseBackoff(*backoff)
			if err != nil {
				return flagValueErrorf("-backoff %q %v", *backoff, err)
			}
			job.Backoff = b
		}
		if len(inv.args) == 3 {
			job.Payload = []byte(inv.args[2])
			if inv.args[2] == "-" {
				data, err := io.ReadAll(os.Stdin)
				if err != nil {
					return fmt.Errorf("read payload: %w", err)
				}
				job.Payload = data
			}
		}
		return submit(ctx, inv, job)
	}
}

func submit(ctx context.Context, inv *invocation, job protocol.Job) (err error) {
	tel, err := telemetry.Setup(ctx, telemetry.Options{ServiceName: "jetfleet-cli"})
	if err != nil {
		return err
	}
	defer func() {
		// Export what was recorded (a no-op without an OTLP endpoint).
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), inv.conn.timeout)
		defer cancel()
		if serr := tel.Shutdown(sctx); serr != nil {
			fmt.Fprintln(os.Stderr, "jetfleet: exporting the submit's spans:", serr)
		}
	}()
	c, api, err := inv.connectAPI(jetfleet.WithTracerProvider(tel.TracerProvider))
	if err != nil {
		return err
	}
	defer c.close()
	tracer := tel.TracerProvider.Tracer("github.com/jetfleet/jetfleet/services/jetfleet")
	ctx, span := tracer.Start(ctx, "jetfleet submit", trace.WithAttributes(attribute.String(telemetry.LogQueue, job.Queue),
		attribute.String(telemetry.LogKind, job.Kind)))
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	rctx, cancel := c.ctx(ctx)
	defer cancel()
	start := time.Now()
	var res *jetfleet.EnqueueResult
	switch {
	case json.Valid(job.Payload):
		res, err = api.Enqueue(rctx, rawArgs{kind: job.Kind, payload: job.Payload}, enqueueOptions(job)...)
	case job.Unique != nil:
		return flagValueErrorf("-unique-key needs a JSON payload (published through the Go client, which claims the key)")
	default:
		res, err = publishRaw(rctx, c.nc, tracer, job)
	}
	if err != nil {
		return err
	}
	took := time.Since(start)
	out := submitted{EnqueueResult: *res, Subject: protocol.JobSubjectAt(res.Queue, res.Kind, job.Priority), Stream: protocol.StreamJobs,
		TraceID: span.SpanContext().TraceID().String()}
	if !res.ProcessAt.IsZero() {
		out.Subject, out.Stream = protocol.DelayedSubject(res.Queue, res.Kind, res.JobID), protocol.StreamDelayed
	}
	return inv.print(out, func(w io.Writer) error {
		if res.ProcessAtPassed {
			fmt.Fprintf(w, "process_at %s has passed: the job runs now\n", job.ProcessAt.UTC().Format(time.RFC3339))
		}
		if !res.ProcessAt.IsZero() && !res.Duplicate {
			_, err := fmt.Fprintf(w, "delayed job %s until %s (%s seq %d) in %s\ntrace %s\n", res.JobID,
				res.ProcessAt.UTC().Format(time.RFC3339Nano), out.Stream, res.Sequence, took.Round(time.Microsecond), out.TraceID)
			return err
		}
		if res.Duplicate && job.Unique != nil && res.Sequence == 0 {
			_, err := fmt.Fprintf(w, "duplicate: job %s holds unique key %q of %s; not published\n", res.JobID, job.Unique.Key,
				protocol.JobSubject(res.Queue, res.Kind))
			return err
		}
		if res.Duplicate {
			_, err := fmt.Fprintf(w, "duplicate: job %s was already published to %s (%s seq %d); not published again\n",
				res.JobID, out.Subject, out.Stream, res.Sequence)
			return err
		}
		_, err := fmt.Fprintf(w, "published job %s to %s (%s seq %d) in %s\ntrace %s\n", res.JobID, out.Subject, out.Stream,
			res.Sequence, took.Round(time.Microsecond), out.TraceID)
		return err
	})
}

// enqueueOptions are the options of Enqueue that carry job's flags.
func enqueueOptions(job protocol.Job) []jetfleet.EnqueueOption {
	opts := []jetfleet.EnqueueOption{jetfleet.WithQueue(job.Queue)}
	if job.ID != "" {
		opts = append(opts, jetfleet.WithJobID(job.ID))
	}
	if job.Timeout != 0 {
		opts = append(opts, jetfleet.WithTimeout(job.Timeout))
	}
	if job.MaxAttempts != 0 {
		opts = append(opts, jetfleet.WithMaxAttempts(job.MaxAttempts))
	}
	if len(job.Backoff) > 0 {
		opts = append(opts, jetfleet.WithBackoff(job.Backoff...))
	}
	if !job.ProcessAt.IsZero() {
		opts = append(opts, jetfleet.WithProcessAt(job.ProcessAt))
	}
	if job.Priority != "" {
		opts = append(opts, jetfleet.WithPriority(job.Priority))
	}
	if u := job.Unique; u != nil {
		opts = append(opts, jetfleet.WithUnique(u.Key, jetfleet.UniqueOptions{For: u.For, UntilFinished: u.UntilFinished}))
	}
	for k, vs := range job.Header {
		for _, v := range vs {
			opts = append(opts, jetfleet.WithHeader(k, v))
		}
	}
	return opts
}

// publishRaw publishes a job whose payload is not JSON byte for byte, which
// Enqueue cannot (encoding/json refuses a MarshalJSON that returns anything
// but JSON), with the same producer span and trace context Enqueue gives.
func publishRaw(ctx context.Context, nc *nats.Conn, tracer trace.Tracer, job protocol.Job) (*jetfleet.EnqueueResult, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if job.ID == "" {
		job.ID = nuid.Next()
	}
	if job.Header == nil {
		job.Header = nats.Header{}
	}
	ctx, span := tracer.Start(ctx, "jetfleet.enqueue "+job.Kind, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String(telemetry.LogJobID, job.ID), attribute.String(telemetry.LogQueue, job.Queue),
			attribute.String(telemetry.LogKind, job.Kind)))
	defer span.End()
	telemetry.Inject(ctx, job.Header)
	msg, err := job.Msg()
	if err == nil {
		var ack *jetstream.PubAck
		if ack, err = js.PublishMsg(ctx, msg); err == nil {
			span.SetAttributes(attribute.Int64("stream_sequence", int64(ack.Sequence)), attribute.Bool("duplicate", ack.Duplicate))
			res := &jetfleet.EnqueueResult{JobID: job.ID, Queue: job.Queue, Kind: job.Kind, Sequence: ack.Sequence, Duplicate: ack.Duplicate}
			if msg.Header.Get(protocol.HeaderNatsSchedule) != "" {
				res.ProcessAt = job.ProcessAt
			} else if !job.ProcessAt.IsZero() {
				res.ProcessAtPassed = true
			}
			return res, nil
		}
		err = fmt.Errorf("publish to %s: %w", msg.Subject, err)
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	return nil, err
}
