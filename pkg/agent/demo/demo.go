// Package demo holds the demonstration job kinds that the dev fleet's agent
// runs, and that the agent service runs with handlers of type demo: echo,
// sleep and fail. They show what a job's life looks like without writing a
// handler.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// The demos.
const (
	// Echo succeeds, writes its payload to the job's output, logs the
	// payload's size (never the payload: it may be large) and returns it as
	// its result ({"payload_bytes":N}).
	Echo = "echo"
	// Sleep sleeps for the payload's duration ({"duration":"2s"}; 1s by default), reporting its progress once a second.
	Sleep = "sleep"
	// Fail fails every attempt, so the job lands in the dead-letter stream;
	// {"non_retryable":true} fails it at once.
	Fail = "fail"
)

// Names lists the demos.
func Names() []string { return []string{Echo, Fail, Sleep} }

// Handler returns the handler of the demo called name.
func Handler(name string, logger *slog.Logger) (agent.Handler, error) {
	switch name {
	case Echo:
		return echo(logger), nil
	case Sleep:
		return agent.Typed(sleep), nil
	case Fail:
		return fail, nil
	}
	return nil, fmt.Errorf("unknown demo %q: use echo, sleep or fail", name)
}

// RegisterAll registers every demo on a under its own name as the kind.
func RegisterAll(a *agent.Agent, logger *slog.Logger) error {
	var errs []error
	for _, name := range Names() {
		h, err := Handler(name, logger)
		if err == nil {
			err = a.Register(name, h, agent.KindOptions{})
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// echo succeeds, writes its payload to the job's output (which keeps its
// tail) and logs the payload's size.
func echo(logger *slog.Logger) agent.Handler {
	return func(ctx context.Context, job *agent.Job) error {
		_, _ = job.Output().Write(job.Payload)
		logger.InfoContext(ctx, "echo", telemetry.LogJobID, job.ID, "payload_bytes", len(job.Payload))
		return agent.RecordResult(ctx, map[string]int{"payload_bytes": len(job.Payload)})
	}
}

// sleepPayload is the payload of a sleep job: {"duration":"2s"}. Defaults to 1s.
type sleepPayload struct {
	Duration string `json:"duration"`
}

func sleep(ctx context.Context, _ *agent.Job, p sleepPayload) error {
	d := time.Second
	if p.Duration != "" {
		var err error
		if d, err = time.ParseDuration(p.Duration); err != nil || d < 0 {
			return agent.Malformed(fmt.Errorf("duration %q is not a duration such as 2s", p.Duration))
		}
	}
	// It reports how far it got once a second, as a long job would.
	start := time.Now()
	done := time.After(d)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			slept := time.Since(start).Round(time.Second)
			if err := agent.ReportProgress(ctx, min(float64(slept)/float64(d), 1), fmt.Sprintf("slept %s of %s", slept, d)); err != nil {
				return err
			}
		}
	}
}

// failPayload is the payload of a fail job: {"non_retryable":true} fails for
// good at once; anything else fails every attempt until the last one.
type failPayload struct {
	NonRetryable bool   `json:"non_retryable"`
	Message      string `json:"message"`
}

func fail(_ context.Context, job *agent.Job) error {
	var p failPayload
	if len(job.Payload) > 0 {
		if err := json.Unmarshal(job.Payload, &p); err != nil {
			return agent.Malformed(err)
		}
	}
	msg := p.Message
	if msg == "" {
		msg = "demo failure"
	}
	err := fmt.Errorf("%s (attempt %d of %d)", msg, job.Attempt, job.MaxAttempts)
	if p.NonRetryable {
		return agent.NonRetryable(err)
	}
	return err
}
