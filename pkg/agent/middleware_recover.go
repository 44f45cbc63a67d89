package agent

import (
	"context"
	"runtime/debug"
)

// Recover turns a panic in the handler into a *PanicError carrying the
// stack, so the job fails like any other error and the agent keeps running.
func Recover() Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, job *Job) (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = &PanicError{Value: r, Stack: string(debug.Stack())}
				}
			}()
			return next(ctx, job)
		}
	}
}
