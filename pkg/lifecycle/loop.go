package lifecycle

import (
	"context"
	"errors"
	"sync"
)

// Runner runs background goroutines for a component and gives it a Stop
// that is bounded by a context and safe to call twice. Embed it, call Go from
// Start for every goroutine, and call Stop from the component's Stop.
type Runner struct {
	mu      sync.Mutex
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	done    chan struct{}
	started bool
	stopped bool
}

// ErrAlreadyStarted is returned by Begin on a second start.
var ErrAlreadyStarted = errors.New("lifecycle: already started")

// Begin prepares the runner for goroutines. The returned context is cancelled
// by Stop; it does not inherit ctx's cancellation, because Start's ctx only
// bounds the start.
func (r *Runner) Begin(ctx context.Context) (context.Context, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return nil, ErrAlreadyStarted
	}
	r.started = true
	r.ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	r.done = make(chan struct{})
	return r.ctx, nil
}

// Go runs fn in a goroutine that Stop waits for.
func (r *Runner) Go(fn func(ctx context.Context)) {
	r.mu.Lock()
	ctx := r.ctx
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		fn(ctx)
	}()
}

// Context is the context of the running component; it ends when Stop begins.
func (r *Runner) Context() context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx == nil {
		return context.Background()
	}
	return r.ctx
}

// Stop cancels the goroutines' context and waits for them until ctx ends.
// It returns ctx's error when the goroutines did not finish in time.
func (r *Runner) Stop(ctx context.Context) error {
	r.mu.Lock()
	if !r.started {
		r.mu.Unlock()
		return nil
	}
	if !r.stopped {
		r.stopped = true
		r.cancel()
		go func() {
			r.wg.Wait()
			close(r.done)
		}()
	}
	done := r.done
	r.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Done is closed once the component's goroutines have all returned after
// Stop. It is nil before Begin.
func (r *Runner) Done() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done
}
