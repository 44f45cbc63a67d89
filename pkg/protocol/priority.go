package protocol

import (
	"fmt"
	"strings"
)

// Priorities within a queue (docs/protocol.md §2.3). A default-priority job
// is published on jobs.<queue>.<kind>, a high- or low-priority one on
// jobs.<queue>.<kind>.<priority>; each priority has its own consumer, and an
// agent with a free slot asks the higher priorities for jobs first, giving
// lower ones a share so they never starve.
const (
	PriorityHigh    = "high"
	PriorityDefault = "default"
	PriorityLow     = "low"
)

// Priorities lists the priorities, highest first.
var Priorities = []string{PriorityHigh, PriorityDefault, PriorityLow}

// ValidatePriority checks p: high, default or low; empty is default.
func ValidatePriority(p string) error {
	switch p {
	case "", PriorityHigh, PriorityDefault, PriorityLow:
		return nil
	}
	return fmt.Errorf("priority %q is not one of high, default, low", p)
}

// priorityToken is the subject token of p: none for default.
func priorityToken(p string) string {
	if p == PriorityDefault {
		return ""
	}
	return p
}

// JobSubjectAt is the subject a job of kind is published on in queue at
// priority p (empty or default: JobSubject).
func JobSubjectAt(queue, kind, p string) string {
	if t := priorityToken(p); t != "" {
		return JobSubject(queue, kind) + "." + t
	}
	return JobSubject(queue, kind)
}

// PriorityConsumer is the consumer of queue's jobs at priority p:
// queue-<queue> for default, queue-<queue>=<priority> otherwise (a queue
// name has no "=", so no queue's consumer takes that name).
func PriorityConsumer(queue, p string) string {
	if t := priorityToken(p); t != "" {
		return QueueConsumer(queue) + "=" + t
	}
	return QueueConsumer(queue)
}

// PrioritySubjects is the filter of queue's consumer at priority p.
func PrioritySubjects(queue, p string) string {
	if t := priorityToken(p); t != "" {
		return "jobs." + queue + ".*." + t
	}
	return QueueSubjects(queue)
}

// ParseQueueConsumer reads a queue consumer's name: its queue and
// priority. ok is false for a name that is not a queue consumer's.
func ParseQueueConsumer(name string) (queue, p string, ok bool) {
	rest, ok := strings.CutPrefix(name, QueueConsumer(""))
	if !ok || rest == "" {
		return "", "", false
	}
	queue, t, hasPriority := strings.Cut(rest, "=")
	switch {
	case !hasPriority:
		return queue, PriorityDefault, true
	case t == PriorityHigh || t == PriorityLow:
		return queue, t, true
	}
	return "", "", false
}

// JobPriority is the priority of a job on subject (jobs.<queue>.<kind> or
// jobs.<queue>.<kind>.<priority>): default when it names none.
func JobPriority(subject string) string {
	if strings.Count(subject, ".") == 3 {
		if t := subject[strings.LastIndexByte(subject, '.')+1:]; t == PriorityHigh || t == PriorityLow {
			return t
		}
	}
	return PriorityDefault
}
