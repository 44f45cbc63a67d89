package supervisor

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// Reconcile runs one reconciliation pass of max deliveries now.
func (s *Supervisor) Reconcile(ctx context.Context) (int, error) { return s.reconcile(ctx) }

// RaiseAlert raises an alert as the leader would, and reports whether it was sent.
func (s *Supervisor) RaiseAlert(ctx context.Context, al *jetfleetpb.Alert) bool {
	return s.alerter.raise(ctx, al)
}

// Registry is the Prometheus registry the supervisor's metrics land in.
func (s *Supervisor) Registry() *prometheus.Registry { return s.env.Telemetry.Registry }

// AgentStates is this replica's view of the agents: id → state.
func (s *Supervisor) AgentStates() map[string]string {
	out := map[string]string{}
	for _, a := range s.tracker.snapshot(s.clk.Now()) {
		out[a.ID] = a.State
	}
	return out
}
