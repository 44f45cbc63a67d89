package topology

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// How queues come to exist: a queue is served by its durable consumer
// queue-<queue> on JOBS. The consumer of a queue declared under
// topology.queues is created and kept at its settings by the supervisor
// (EnsureDeclaredQueues, when it starts); `jetfleet queue add` creates one
// on demand; and an agent creates the consumer of each queue it serves if
// it is missing. Jobs on a subject no consumer delivers are dead-lettered
// by the supervisor (see UnroutableSubjects).

// EnsureDeclaredQueues creates or updates the consumer of every queue
// declared in c.Queues.
func EnsureDeclaredQueues(ctx context.Context, js jetstream.JetStream, c Config) error {
	names := make([]string, 0, len(c.Queues))
	for q := range c.Queues {
		names = append(names, q)
	}
	slices.Sort(names)
	for _, q := range names {
		if _, err := EnsureQueue(ctx, js, c, q); err != nil {
			return fmt.Errorf("queue %s: %w", q, err)
		}
	}
	return nil
}

// Declared reports whether queue is declared under topology.queues.
func (c Config) Declared(queue string) bool {
	_, ok := c.Queues[queue]
	return ok
}

// QueueFilters returns the filter subjects of the consumers of the JOBS
// stream, by consumer name.
func QueueFilters(ctx context.Context, jobs jetstream.Stream) (map[string][]string, error) {
	out := map[string][]string{}
	lister := jobs.ListConsumers(ctx)
	for ci := range lister.Info() {
		filters := slices.Clone(ci.Config.FilterSubjects)
		if ci.Config.FilterSubject != "" {
			filters = append(filters, ci.Config.FilterSubject)
		}
		if len(filters) == 0 {
			filters = []string{protocol.JobsSubjects}
		}
		out[ci.Name] = filters
	}
	if err := lister.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return nil, err
	}
	// In a cluster a consumer whose leader is down or not yet elected is
	// left out of that list (the server reports it as missing, which the
	// client drops); its name still comes from the cluster's assignments.
	// An incomplete list must not make a served queue look unserved.
	names := jobs.ConsumerNames(ctx)
	for name := range names.Name() {
		if _, ok := out[name]; !ok {
			return nil, fmt.Errorf("consumer %s of %s: %w", name, protocol.StreamJobs, ErrConsumerUnavailable)
		}
	}
	if err := names.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return nil, err
	}
	return out, nil
}

// ErrConsumerUnavailable: a consumer exists but its configuration cannot be
// read now (in a cluster, while it has no leader).
var ErrConsumerUnavailable = errors.New("the consumer exists but cannot be read now (no leader?)")

// UnroutableSubjects returns the subjects of JOBS that hold messages no
// consumer delivers, with how many each holds: a subject not of the form
// jobs.<queue>.<kind> with valid tokens that no consumer's filter matches
// (jobs.default, jobs.<a 200-character token>.x), or a queue without a
// consumer (jobs.nosuchqueue.echo). Such jobs would wait unseen for ever.
// While a consumer of JOBS cannot be read (ErrConsumerUnavailable) it judges
// nothing.
func UnroutableSubjects(ctx context.Context, jobs jetstream.Stream) (map[string]uint64, error) {
	info, err := jobs.Info(ctx, jetstream.WithSubjectFilter(protocol.JobsSubjects))
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	if len(info.State.Subjects) == 0 {
		return out, nil
	}
	filters, err := QueueFilters(ctx, jobs)
	if err != nil {
		return nil, err
	}
	for subject, n := range info.State.Subjects {
		if n > 0 && !served(subject, filters) {
			out[subject] = n
		}
	}
	return out, nil
}

func served(subject string, filters map[string][]string) bool {
	for _, fs := range filters {
		for _, f := range fs {
			if SubjectMatches(f, subject) {
				return true
			}
		}
	}
	return false
}

// SubjectMatches reports whether subject matches filter, which may hold
// the wildcards * (one token) and > (one or more tokens, last).
func SubjectMatches(filter, subject string) bool {
	ft, st := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, f := range ft {
		switch {
		case f == ">":
			return len(st) > i
		case i >= len(st):
			return false
		case f != "*" && f != st[i]:
			return false
		}
	}
	return len(ft) == len(st)
}
