package agent

import (
	"context"
	"fmt"
	"reflect"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

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

// AddHandler registers handle for the jobs of args type T: the kind is what
// T's Kind method returns (jetfleet.Args, the type jetfleet.Client.Enqueue
// takes), and each job's JSON payload is decoded into a T for the handler.
// A payload that does not decode dead-letters the job with reason
// malformed_payload. opts, at most one, configure the kind. Call it before
// Start: after, it returns an error.
func AddHandler[T jetfleet.Args](a *Agent, handle func(ctx context.Context, job *Job, args T) error, opts ...KindOptions) error {
	if len(opts) > 1 {
		return fmt.Errorf("agent: AddHandler takes at most one KindOptions, got %d", len(opts))
	}
	var o KindOptions
	if len(opts) == 1 {
		o = opts[0]
	}
	return a.Register(kindOf[T](), Typed(handle), o)
}

// kindOf is the kind of args type T, asked of a zero T (a new value when T
// is a pointer type, so that Kind need not handle nil).
func kindOf[T jetfleet.Args]() string {
	var zero T
	if t := reflect.TypeFor[T](); t.Kind() == reflect.Pointer {
		zero = reflect.New(t.Elem()).Interface().(T)
	}
	return zero.Kind()
}
