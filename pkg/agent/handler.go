package agent

import "context"

// Handler runs one job. What it returns decides the job's fate (see the
// package documentation).
type Handler func(ctx context.Context, job *Job) error

// Middleware wraps a Handler with one concern.
type Middleware func(Handler) Handler

// Chain applies middleware so that the first one is the outermost.
func Chain(h Handler, middleware ...Middleware) Handler {
	for i := len(middleware) - 1; i >= 0; i-- {
		h = middleware[i](h)
	}
	return h
}

// Typed adapts a handler of a decoded JSON payload. A payload that does not
// decode into T dead-letters the job with reason malformed_payload.
func Typed[T any](fn func(ctx context.Context, job *Job, payload T) error) Handler {
	return func(ctx context.Context, job *Job) error {
		var payload T
		if err := job.Decode(&payload); err != nil {
			return err
		}
		return fn(ctx, job, payload)
	}
}
