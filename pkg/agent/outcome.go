package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// SnoozeError asks for the job to run again after Delay without spending an
// attempt. Return it with Snooze.
type SnoozeError struct{ Delay time.Duration }

func (e *SnoozeError) Error() string { return fmt.Sprintf("snoozed for %s", e.Delay) }

// Snooze ends the attempt and runs the job again after d, without spending
// an attempt. Snoozes still count against the queue's max_deliver.
func Snooze(d time.Duration) error { return &SnoozeError{Delay: d} }

// RetryError is a failure with an explicit delay before the next attempt.
type RetryError struct {
	Err   error
	Delay time.Duration
}

func (e *RetryError) Error() string { return e.Err.Error() }
func (e *RetryError) Unwrap() error { return e.Err }

// Retry fails the attempt and waits d before the next one (instead of the
// retry policy's backoff). The last attempt still dead-letters.
func Retry(err error, d time.Duration) error { return &RetryError{Err: err, Delay: d} }

// NonRetryableError fails the job for good.
type NonRetryableError struct{ Err error }

func (e *NonRetryableError) Error() string { return e.Err.Error() }
func (e *NonRetryableError) Unwrap() error { return e.Err }

// NonRetryable fails the job without further attempts: it is dead-lettered.
func NonRetryable(err error) error { return &NonRetryableError{Err: err} }

// CancelError ends the job as cancelled.
type CancelError struct{ Err error }

func (e *CancelError) Error() string { return "cancelled: " + e.Err.Error() }
func (e *CancelError) Unwrap() error { return e.Err }

// Cancel ends the job as cancelled; it is dead-lettered with reason cancelled.
func Cancel(err error) error { return &CancelError{Err: err} }

// MalformedError reports a payload the handler cannot read.
type MalformedError struct{ Err error }

func (e *MalformedError) Error() string { return "malformed payload: " + e.Err.Error() }
func (e *MalformedError) Unwrap() error { return e.Err }

// Malformed fails the job for good because its payload cannot be read.
func Malformed(err error) error { return &MalformedError{Err: err} }

// PanicError is a recovered panic.
type PanicError struct {
	Value any
	Stack string
}

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v\n%s", e.Value, e.Stack) }

// TimeoutError reports an attempt that outlived its deadline.
type TimeoutError struct{ Timeout time.Duration }

func (e *TimeoutError) Error() string { return fmt.Sprintf("attempt timed out after %s", e.Timeout) }

// cancelCommandError is the cancel cause of a job cancelled through the
// agent's control subject, or found in bucket cancels before it started.
type cancelCommandError struct {
	reason string
	// deadLetter: the cancel asked for a dead letter (reason cancelled).
	deadLetter bool
}

func (e *cancelCommandError) Error() string {
	if e.reason == "" {
		return "cancelled by command"
	}
	return "cancelled by command: " + e.reason
}

// timeoutCommandError is the cancel cause of an attempt the supervisor
// timed out through the agent's control subject: it ran past its deadline
// and the supervisor's grace. It fails like a timeout (retried while
// attempts remain), not like a cancellation.
type timeoutCommandError struct{ reason string }

func (e *timeoutCommandError) Error() string {
	if e.reason == "" {
		return "timed out by the supervisor"
	}
	return "timed out by the supervisor: " + e.reason
}

// errReleased is the cancel cause of jobs handed back without running to
// the end: errStopping (the agent stops) or errNoSlot.
var (
	errReleased = errors.New("job handed back for redelivery")
	errStopping = fmt.Errorf("agent stopping: %w", errReleased)
	// errNoSlot: a delivery arrived for no free slot (a pull request counted
	// lost answered after all, as after a reconnect); running it would
	// exceed the agent's concurrency.
	errNoSlot = fmt.Errorf("no free slot: %w", errReleased)
)

// action is what settle does with a finished attempt.
type action int

const (
	actAck action = iota
	actRetry
	actSnooze
	actDeadLetter
	actRelease
	// actCancel ends the run as cancelled: event cancelled, then TERM, no
	// dead letter.
	actCancel
)

// verdict is the single mapping from a handler's result to a JetStream action.
type verdict struct {
	action action
	delay  time.Duration
	// reason and code describe failures (dead-letter reason, error code).
	reason string
	code   string
	// event is the job event type published for the outcome.
	event string
}

// decide maps a handler result to a verdict. attempt and maxAttempts are of
// this delivery; delay computes the policy's backoff for a retry; ctxErr
// is the cause the job's context was cancelled with, if any.
func decide(err error, attempt, maxAttempts int, policy RetryPolicy, backoff func() time.Duration, cause error) verdict {
	// Cheap cases first: a succeeded job pays for no error inspection.
	if errors.Is(cause, errReleased) {
		return verdict{action: actRelease, event: protocol.EventReleased}
	}
	if err == nil {
		return verdict{action: actAck, event: protocol.EventSucceeded}
	}
	if snooze, ok := errors.AsType[*SnoozeError](err); ok {
		return verdict{action: actSnooze, delay: snooze.Delay, event: protocol.EventSnoozed}
	}
	if cmd, ok := errors.AsType[*cancelCommandError](cause); ok {
		return cancelVerdict(cmd.deadLetter)
	}
	if isType[*CancelError](err) {
		return cancelVerdict(true)
	}
	if isType[*MalformedError](err) {
		return verdict{action: actDeadLetter, reason: protocol.ReasonMalformedPayload, code: protocol.CodeMalformedPayload, event: protocol.EventFailed}
	}
	if isType[*NonRetryableError](err) || policy.isNonRetryable(err) {
		return verdict{action: actDeadLetter, reason: protocol.ReasonNonRetryable, code: protocol.CodeNonRetryable, event: protocol.EventFailed}
	}
	code := protocol.CodeHandlerError
	switch {
	case isType[*TimeoutError](err), errors.Is(err, context.DeadlineExceeded), isType[*timeoutCommandError](cause):
		code = protocol.CodeTimeout
	case isType[*PanicError](err):
		code = protocol.CodePanic
	}
	if attempt >= maxAttempts {
		return verdict{action: actDeadLetter, reason: protocol.ReasonMaxAttempts, code: code, event: protocol.EventFailed}
	}
	d := backoff()
	if retry, ok := errors.AsType[*RetryError](err); ok {
		d = retry.Delay
	}
	return verdict{action: actRetry, delay: d, code: code, event: protocol.EventRetrying}
}

// cancelVerdict ends a cancelled job: as cancelled, or dead-lettered with
// reason cancelled when the cancel (or the handler's Cancel) asks for it.
func cancelVerdict(deadLetter bool) verdict {
	if deadLetter {
		return verdict{action: actDeadLetter, reason: protocol.ReasonCancelled, code: protocol.CodeCancelled, event: protocol.EventFailed}
	}
	return verdict{action: actCancel, reason: protocol.ReasonCancelled, code: protocol.CodeCancelled, event: protocol.EventCancelled}
}

// isType reports whether err's tree holds an error of type E.
func isType[E error](err error) bool {
	_, ok := errors.AsType[E](err)
	return ok
}
