package lifecycle

import (
	"context"
	"sync"
)

// Flag is a boolean one can wait on: a component's state (leading, ready)
// that other goroutines and tests await instead of polling.
type Flag struct {
	mu sync.Mutex
	on bool
	ch chan struct{} // closed at the next change; nil while nobody waits
}

// Set turns the flag on or off and wakes the waiters if it changed.
func (f *Flag) Set(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.on != on {
		f.on = on
		if f.ch != nil {
			close(f.ch)
			f.ch = nil
		}
	}
}

// Get reports whether the flag is on.
func (f *Flag) Get() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.on
}

// Wait returns once the flag is on (or off, when on is false), or with
// ctx's error when ctx ends first.
func (f *Flag) Wait(ctx context.Context, on bool) error {
	for {
		f.mu.Lock()
		if f.on == on {
			f.mu.Unlock()
			return nil
		}
		if f.ch == nil {
			f.ch = make(chan struct{})
		}
		ch := f.ch
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
