package agent

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
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
			dc := newDeadlineContext(ctx, job.Deadline)
			defer dc.end(context.Canceled)
			start := time.Now()
			err := next(dc, job)
			// Only the deadline ends dc with DeadlineExceeded: its parent, the
			// job's own context, has none and ends with Canceled.
			if err != nil && errors.Is(dc.Err(), context.DeadlineExceeded) {
				var te *TimeoutError
				if !errors.As(err, &te) {
					return &TimeoutError{Timeout: job.Deadline.Sub(start).Round(time.Millisecond)}
				}
			}
			return err
		}
	}
}

// deadlineContext is what context.WithDeadline returns, except that it
// arms its timer, and joins its parent's cancellation, only when Done is
// first called. Most quick jobs return without waiting on their context,
// and context.WithDeadline costs them a timer, a child entry in the
// parent and four allocations (0.3 µs, and the collector's work); this
// costs one allocation.
//
// Until Done is called, Err asks the clock, then the parent. So a context
// whose deadline passed and whose parent was cancelled, neither noticed
// yet, ends with DeadlineExceeded, whichever came first: a handler that
// ignored its context past its deadline fails as timed out even when the
// supervisor's timeout command cancelled its job meanwhile (the agent reads
// that command from the job context's cause). context.Cause gives
// DeadlineExceeded once the deadline ended it, or the parent's cause once
// the parent did, as for the standard one, except that a cause the parent
// gets after this context ended wins over DeadlineExceeded or Canceled.
type deadlineContext struct {
	context.Context // the parent, for values and its own end

	deadline time.Time
	done     atomic.Pointer[chan struct{}] // set by the first Done or by end
	err      atomic.Value                  // the error it ended with, stored once by end

	mu         sync.Mutex
	timer      *time.Timer // armed by Done
	stopParent func() bool // stops the parent's AfterFunc, armed by Done
	afterFuncs map[*func()]struct{}
}

func newDeadlineContext(parent context.Context, deadline time.Time) *deadlineContext {
	return &deadlineContext{Context: parent, deadline: deadline}
}

// closedDone is the Done channel of a context that ended before anyone
// asked for one.
var closedDone = func() *chan struct{} { c := make(chan struct{}); close(c); return &c }()

func (c *deadlineContext) Deadline() (time.Time, bool) {
	if d, ok := c.Context.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

func (c *deadlineContext) Done() <-chan struct{} {
	if d := c.done.Load(); d != nil {
		return *d
	}
	c.mu.Lock()
	if d := c.done.Load(); d != nil { // ended, or armed, meanwhile
		c.mu.Unlock()
		return *d
	}
	d := make(chan struct{})
	c.done.Store(&d)
	c.mu.Unlock()
	// Armed outside the lock: both may call end at once.
	stopParent := context.AfterFunc(c.Context, func() { c.end(c.Context.Err()) })
	timer := time.AfterFunc(time.Until(c.deadline), func() { c.end(context.DeadlineExceeded) })
	c.mu.Lock()
	c.stopParent, c.timer = stopParent, timer
	ended := c.ended() != nil
	c.mu.Unlock()
	if ended { // it ended while arming: disarm what end could not
		stopParent()
		timer.Stop()
	}
	return d
}

func (c *deadlineContext) Err() error {
	if err := c.ended(); err != nil {
		<-c.Done() // end stores the error just before it closes Done
		return err
	}
	if c.done.Load() != nil {
		return nil // armed: the timer or the parent ends it
	}
	if !time.Now().Before(c.deadline) {
		return c.end(context.DeadlineExceeded)
	}
	if err := c.Context.Err(); err != nil {
		return c.end(err)
	}
	return nil
}

// ended returns the error the context ended with, or nil.
func (c *deadlineContext) ended() error {
	err, _ := c.err.Load().(error)
	return err
}

// AfterFunc lets context.WithCancel and its siblings join this context's
// end without a goroutine per child (the standard library looks for it).
func (c *deadlineContext) AfterFunc(f func()) (stop func() bool) {
	c.Done() // a child waits on this context: it needs its timer
	c.mu.Lock()
	if c.ended() != nil {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	if c.afterFuncs == nil {
		c.afterFuncs = map[*func()]struct{}{}
	}
	key := &f
	c.afterFuncs[key] = struct{}{}
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, waiting := c.afterFuncs[key]
		delete(c.afterFuncs, key)
		return waiting
	}
}

// end ends the context with err (Canceled for nil) unless it ended
// already, and returns the error it ended with.
func (c *deadlineContext) end(err error) error {
	if err == nil {
		err = context.Canceled
	}
	c.mu.Lock()
	if prior := c.ended(); prior != nil {
		c.mu.Unlock()
		return prior
	}
	c.err.Store(err) // before Done closes: Err is never nil once Done is closed
	if d := c.done.Load(); d != nil {
		close(*d)
	} else {
		c.done.Store(closedDone)
	}
	timer, stopParent, afterFuncs := c.timer, c.stopParent, c.afterFuncs
	c.afterFuncs = nil
	c.mu.Unlock()
	if timer != nil {
		timer.Stop()
	}
	if stopParent != nil {
		stopParent()
	}
	for f := range afterFuncs {
		go (*f)()
	}
	return err
}

func (c *deadlineContext) String() string {
	return "agent.deadlineContext(" + c.deadline.String() + ")"
}
