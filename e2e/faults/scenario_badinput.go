package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Scenario bad-input: messages on jobs.> that are not well-formed jobs.
// Each one JetStream accepts must, within seconds, be run, or
// dead-lettered with a reason, or at least be pending where `jetfleet
// status` counts it (a consumer's pending). Anything else is unaccounted:
// stored, and never seen again.

// badInputWait bounds how long accepted messages get to be accounted for.
const badInputWait = 10 * time.Second

type badCase struct {
	name string
	spec jobSpec
}

func badCases() []badCase {
	hdr := func(k, v string) nats.Header { return nats.Header{k: []string{v}} }
	fx := protocol.JobSubject(queueDefault, kindEffect)
	return []badCase{
		{"valid job (control)", jobSpec{subject: fx, id: "bad-control"}},
		{"jobs.default (two tokens)", jobSpec{subject: "jobs." + queueDefault, id: "bad-two-tokens"}},
		{"jobs.<200-char token>.x", jobSpec{subject: "jobs." + strings.Repeat("q", 200) + ".x", id: "bad-long-token"}},
		{"jobs.nosuchqueue.echo (no consumer)", jobSpec{subject: "jobs.nosuchqueue.echo", id: "bad-no-queue"}},
		{"jobs.default.x.y (four tokens)", jobSpec{subject: "jobs." + queueDefault + ".x.y", id: "bad-four-tokens"}},
		{"Jetfleet-Timeout: soon", jobSpec{subject: fx, id: "bad-timeout", header: hdr(protocol.HeaderTimeout, "soon")}},
		{"Jetfleet-Max-Attempts: zero", jobSpec{subject: fx, id: "bad-attempts", header: hdr(protocol.HeaderMaxAttempts, "zero")}},
		{"Jetfleet-Backoff: fast", jobSpec{subject: fx, id: "bad-backoff", header: hdr(protocol.HeaderBackoff, "fast")}},
		{"unknown kind", jobSpec{subject: protocol.JobSubject(queueDefault, "nosuchkind"), id: "bad-unknown-kind"}},
		{"payload over max_job_size", jobSpec{subject: fx, id: "bad-oversized", payload: make([]byte, 600*1024)}},
		{"malformed JSON to kind sleep", jobSpec{subject: protocol.JobSubject(queueDefault, kindDemoSleep), id: "bad-json",
			payload: []byte(`{"duration":`)}},
		{"Jetfleet-Job-Id with spaces", jobSpec{subject: fx, id: "bad-job-id", header: hdr(protocol.HeaderJobID, "not a job id")}},
	}
}

// badOutcome is what became of one accepted message.
type badOutcome struct {
	ran     int    // end lines of its job
	dead    string // dead letter reason
	pending string // the consumer that counts it as pending
	queued  bool   // still in JOBS
}

func (o badOutcome) accounted() bool { return o.ran > 0 || o.dead != "" || o.pending != "" }

func (o badOutcome) String() string {
	switch {
	case o.dead != "" && o.ran > 0:
		return fmt.Sprintf("ran %d×, then dead-lettered (%s)", o.ran, o.dead)
	case o.dead != "":
		return "dead-lettered (" + o.dead + ")"
	case o.ran > 0:
		return fmt.Sprintf("ran %d×", o.ran)
	case o.pending != "":
		return "pending in " + o.pending
	case o.queued:
		return "UNACCOUNTED: in JOBS, no consumer counts it"
	default:
		return "UNACCOUNTED: gone from JOBS, never run, no dead letter"
	}
}

func runBadInput(ctx context.Context, env *runEnv, f *fleet, r *row) error {
	pb := newPublisher(f.js)
	pb.giveUp = 10 * time.Second
	cases := badCases()
	var accepted []publishedJob
	var refused []string
	names := map[string]string{}
	for _, c := range cases {
		names[c.spec.id] = c.name
		job, err := pb.publish(ctx, c.spec)
		if err != nil {
			refused = append(refused, fmt.Sprintf("%s (%s)", c.name, refusal(err)))
			env.log.Debug("refused at publish", "case", c.name, "error", err)
			continue
		}
		accepted = append(accepted, job)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}

	// Wait until every accepted message is accounted for, at most badInputWait.
	_ = waitFor(ctx, badInputWait, func(ctx context.Context) (bool, error) {
		s, err := f.snapshot(ctx)
		if err != nil {
			return false, err
		}
		for _, o := range badOutcomes(s, accepted) {
			if !o.accounted() {
				return false, nil
			}
		}
		return true, nil
	})
	if err := waitFor(ctx, 30*time.Second, f.historyCaughtUp); err != nil {
		r.note("the supervisor's history had not caught up with EVENTS: %v", err)
	}
	snap, err := f.snapshot(ctx)
	if err != nil {
		return err
	}
	outcomes := badOutcomes(snap, accepted)

	r.published, r.runOnce, r.runTwice, r.deadLetters, r.unaccounted = len(accepted), 0, 0, 0, 0
	var unaccounted []string
	reasons := map[string]int{}
	for _, j := range accepted {
		o := outcomes[j.id]
		env.log.Info("bad input", "case", names[j.id], "subject", truncate(j.subject, 40), "stream_seq", j.seq, "outcome", o.String())
		switch {
		case o.ran == 1:
			r.runOnce++
		case o.ran > 1:
			r.runTwice++
		}
		if o.dead != "" {
			r.deadLetters++
			reasons[o.dead]++
		}
		if !o.accounted() {
			r.unaccounted++
			unaccounted = append(unaccounted, names[j.id])
		}
	}
	if len(refused) > 0 {
		r.note("refused at publish: %s", strings.Join(refused, ", "))
	}
	if len(reasons) > 0 {
		r.note("dead letters: %s", countsOf(reasons))
	}
	if len(unaccounted) > 0 {
		r.note("unaccounted: %s", strings.Join(unaccounted, ", "))
	}
	snap.historyVsExecutions(r)
	snap.repeatedTerminalEvents(r)
	snap.concurrency(r)
	return nil
}

// badOutcomes says what became of each accepted message, matched by its
// stream sequence (dead letters, queued messages) and by the job ids it may
// run under (its Jetfleet-Job-Id, its Nats-Msg-Id, JOBS-<sequence>).
func badOutcomes(s *snapshot, accepted []publishedJob) map[string]badOutcome {
	out := map[string]badOutcome{}
	for _, j := range accepted {
		var o badOutcome
		ids := []string{j.id, protocol.FallbackJobID(j.seq)}
		if h := j.header.Get(protocol.HeaderJobID); h != "" {
			ids = append(ids, h)
		}
		for _, id := range ids {
			o.ran = max(o.ran, s.effects.runs(id))
		}
		for _, l := range s.letters {
			if l.originalSeq == j.seq {
				o.dead = l.reason
				if l.kind != "" && l.kind != kindOf(j.subject) {
					o.dead += " as kind " + l.kind
				}
			}
		}
		for _, q := range s.queued {
			if q.seq == j.seq {
				o.queued = true
				for _, c := range s.consumers {
					if c.pending+c.ackPending > 0 && slices.ContainsFunc(c.filters, func(f string) bool { return subjectMatches(f, j.subject) }) {
						o.pending = c.name
					}
				}
			}
		}
		out[j.id] = o
	}
	return out
}

// subjectMatches reports whether subject matches the NATS filter.
func subjectMatches(filter, subject string) bool {
	ft, st := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, t := range ft {
		if t == ">" {
			return len(st) > i
		}
		if i >= len(st) || (t != "*" && t != st[i]) {
			return false
		}
	}
	return len(ft) == len(st)
}

// refusal is the server's reason for refusing a publish.
func refusal(err error) string {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return fmt.Sprintf("%s, error %d", apiErr.Description, apiErr.ErrorCode)
	}
	return err.Error()
}

func kindOf(subject string) string {
	if i := strings.LastIndexByte(subject, '.'); i >= 0 {
		return subject[i+1:]
	}
	return subject
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
