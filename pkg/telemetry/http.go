package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ReadyCheck reports why a service is not ready, or nil.
type ReadyCheck func(ctx context.Context) error

// HTTPServer serves /metrics, /healthz (the process is up) and /readyz (every
// registered check passes). It is a lifecycle component.
type HTTPServer struct {
	addr     string
	registry *prometheus.Registry
	logger   *slog.Logger

	mu     sync.Mutex
	checks map[string]ReadyCheck
	srv    *http.Server
	ln     net.Listener
}

// NewHTTPServer returns a server for addr (host:port; port 0 picks one).
func NewHTTPServer(addr string, registry *prometheus.Registry, logger *slog.Logger) *HTTPServer {
	return &HTTPServer{addr: addr, registry: registry, logger: logger, checks: map[string]ReadyCheck{}}
}

// Name implements lifecycle.Named.
func (s *HTTPServer) Name() string { return "http " + s.addr }

// AddReadyCheck registers a readiness check under name.
func (s *HTTPServer) AddReadyCheck(name string, check ReadyCheck) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks[name] = check
}

// Addr is the address the server listens on once started.
func (s *HTTPServer) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return s.addr
	}
	return s.ln.Addr().String()
}

// Handler returns the server's routes, for embedding in another server.
func (s *HTTPServer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", s.serveReady)
	return mux
}

func (s *HTTPServer) serveReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	s.mu.Lock()
	checks := make(map[string]ReadyCheck, len(s.checks))
	for name, c := range s.checks {
		checks[name] = c
	}
	s.mu.Unlock()
	var errs []error
	for name, check := range checks {
		if err := check(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ready")
}

// Start listens and serves in the background.
func (s *HTTPServer) Start(context.Context) error {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", s.addr, err)
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	s.mu.Lock()
	s.ln, s.srv = ln, srv
	s.mu.Unlock()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Error("http server failed", LogError, err)
		}
	}()
	return nil
}

// Stop shuts the server down gracefully within ctx.
func (s *HTTPServer) Stop(ctx context.Context) error {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.Shutdown(ctx)
}
