// Package lifecycle is the one start/stop contract of every long-running
// jetfleet component, a Group that starts components in order and stops them
// in reverse, and Run, which runs a group until SIGINT or SIGTERM.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// Component is anything with a lifetime. Start returns once the component
// is running (or failed to start); Stop returns once it has stopped or ctx
// ended, and is safe to call twice and before Start.
type Component interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// Named is implemented by components that want their name in logs and errors.
type Named interface {
	Name() string
}

func nameOf(c Component) string {
	if n, ok := c.(Named); ok {
		return n.Name()
	}
	return fmt.Sprintf("%T", c)
}

// Group starts its components in order and stops the started ones in
// reverse order. It is itself a Component.
type Group struct {
	name       string
	components []Component

	mu      sync.Mutex
	started []Component
}

// NewGroup returns a group of components, started in the order given.
func NewGroup(name string, components ...Component) *Group {
	return &Group{name: name, components: components}
}

// Name implements Named.
func (g *Group) Name() string { return g.name }

// Start starts every component in order. When one fails, those already
// started are stopped again and the error is returned.
func (g *Group) Start(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.components {
		if err := c.Start(ctx); err != nil {
			startErr := fmt.Errorf("start %s: %w", nameOf(c), err)
			return errors.Join(startErr, g.stopLocked(context.WithoutCancel(ctx)))
		}
		g.started = append(g.started, c)
	}
	return nil
}

// Stop stops the started components in reverse order, all of them even
// when some fail, within ctx.
func (g *Group) Stop(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stopLocked(ctx)
}

func (g *Group) stopLocked(ctx context.Context) error {
	var errs []error
	for i := len(g.started) - 1; i >= 0; i-- {
		c := g.started[i]
		if err := c.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", nameOf(c), err))
		}
	}
	g.started = nil
	return errors.Join(errs...)
}

// Run starts c, waits until ctx ends or the process gets SIGINT or SIGTERM,
// then stops c within grace. A second signal during the stop exits at once.
func Run(ctx context.Context, logger *slog.Logger, grace time.Duration, c Component) error {
	ctx, stopSignals := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stopSignals()
	if err := c.Start(ctx); err != nil {
		return err
	}
	logger.Info("started", "component", nameOf(c))
	<-ctx.Done()
	stopSignals() // a second signal now kills the process the default way
	logger.Info("stopping", "component", nameOf(c), "grace", grace.String())
	stopCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := c.Stop(stopCtx)
	if err != nil {
		logger.Error("stopped with error", "component", nameOf(c), "error", err)
	} else {
		logger.Info("stopped", "component", nameOf(c))
	}
	return err
}
