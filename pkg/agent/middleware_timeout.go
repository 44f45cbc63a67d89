package agent

import (
	"context"
	"errors"
	"time"
)

// Timeout ends the handler's context at the job's deadline and reports an
// attempt that failed because of it as a *TimeoutError. A handler that
// ignores its context keeps its slot until it returns; the supervisor reports
// such overdue jobs.
func Timeout() Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, job *Job) error {
			if job.Deadline.IsZero() {
				return next(ctx, job)
			}
			ctx, cancel := context.WithDeadline(ctx, job.Deadline)
			defer cancel()
			start := time.Now()
			err := next(ctx, job)
			if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && context.Cause(ctx) == context.DeadlineExceeded {
				var te *TimeoutError
				if !errors.As(err, &te) {
					return &TimeoutError{Timeout: job.Deadline.Sub(start).Round(time.Millisecond)}
				}
			}
			return err
		}
	}
}
