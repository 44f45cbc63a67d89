// Command supervisor runs one replica of the jetfleet supervisor: it tracks
// agents, rescues the jobs of dead ones, dead-letters poison jobs, escalates
// failures and keeps the execution history. Run as many replicas as you
// like; one acts at a time. See docs/supervision.md.
package main

import (
	"context"

	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

func main() {
	cfg := supervisor.DefaultServiceConfig()
	service.Main("supervisor", cfg, func(ctx context.Context, env *service.Env, http *telemetry.HTTPServer) (lifecycle.Component, error) {
		// cfg is loaded by now: read the supervisor section here, not before Main.
		return supervisor.BuildFunc(cfg.Supervisor)(ctx, env, http)
	})
}
