package agentservice

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/agent/command"
	"github.com/jetfleet/jetfleet/pkg/agent/demo"
	"github.com/jetfleet/jetfleet/pkg/agent/webhook"
	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Service is the agent service's component: an agent with a built-in
// handler per configured kind. Stop tells the exec handlers to escalate to
// SIGKILL quickly, stops the agent (a graceful hand-back of running jobs),
// then closes the handlers: no program of an exec handler outlives the
// service.
type Service struct {
	agent    *agent.Agent
	handlers []builtin

	started  atomic.Bool
	stopping atomic.Bool
}

// New builds the handlers of cfg, then the agent on env, and registers them.
func New(cfg *ServiceConfig, env *service.Env) (*Service, error) {
	s := &Service{}
	kinds := slices.Sorted(maps.Keys(cfg.Handlers))
	for _, kind := range kinds {
		h, err := newHandler(kind, cfg.Handlers[kind], env)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("handlers.%s: %w", kind, err)
		}
		s.handlers = append(s.handlers, h)
	}
	a, err := agent.New(env.Conn, cfg.Agent, agent.WithEnv(env))
	if err != nil {
		s.close()
		return nil, err
	}
	s.agent = a
	for i, kind := range kinds {
		if err := a.Register(kind, s.handlers[i].run, cfg.Handlers[kind].KindOptions()); err != nil {
			s.close()
			return nil, fmt.Errorf("handlers.%s: %w", kind, err)
		}
	}
	return s, nil
}

// builtin is one built-in handler.
type builtin struct {
	run           agent.Handler
	beginShutdown func()
	close         func()
}

func newHandler(kind string, hc HandlerConfig, env *service.Env) (builtin, error) {
	switch hc.Type {
	case TypeDemo:
		name := hc.Demo
		if name == "" {
			name = kind
		}
		run, err := demo.Handler(name, env.Logger)
		if err != nil {
			return builtin{}, err
		}
		return builtin{run: run, beginShutdown: func() {}, close: func() {}}, nil
	case TypeExec:
		h, err := command.New(hc.Exec)
		if err != nil {
			return builtin{}, err
		}
		return builtin{run: h.Run, beginShutdown: h.BeginShutdown, close: h.Close}, nil
	case TypeHTTP:
		h, err := webhook.New(hc.HTTP)
		if err != nil {
			return builtin{}, err
		}
		return builtin{run: h.Run, beginShutdown: func() {}, close: h.Close}, nil
	}
	return builtin{}, fmt.Errorf("unknown handler type %q", hc.Type)
}

// BuildFunc returns the service.BuildFunc of the agent service. It reads
// cfg when the service builds (after loading), so main may pass the
// configuration it is about to load. The readiness check "agent" passes
// while the agent runs and is not stopping.
func BuildFunc(cfg *ServiceConfig) service.BuildFunc {
	return func(_ context.Context, env *service.Env, http *telemetry.HTTPServer) (lifecycle.Component, error) {
		s, err := New(cfg, env)
		if err != nil {
			return nil, err
		}
		if http != nil {
			http.AddReadyCheck("agent", s.Ready)
		}
		return s, nil
	}
}

// Agent is the service's agent.
func (s *Service) Agent() *agent.Agent { return s.agent }

// Name implements lifecycle.Named.
func (s *Service) Name() string { return s.agent.Name() }

// Start starts the agent.
func (s *Service) Start(ctx context.Context) error {
	if err := s.agent.Start(ctx); err != nil {
		return err
	}
	s.started.Store(true)
	return nil
}

// Stop stops the agent gracefully within ctx, then kills whatever its exec
// handlers still run and releases the http handlers' connections.
func (s *Service) Stop(ctx context.Context) error {
	s.stopping.Store(true)
	for _, h := range s.handlers {
		h.beginShutdown()
	}
	err := s.agent.Stop(ctx)
	s.close()
	return err
}

func (s *Service) close() {
	for _, h := range s.handlers {
		h.close()
	}
}

// Ready reports whether the agent takes jobs.
func (s *Service) Ready(context.Context) error {
	switch {
	case s.stopping.Load():
		return errors.New("agent is stopping")
	case !s.started.Load():
		return errors.New("agent is not started")
	}
	return nil
}
