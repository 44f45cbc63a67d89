// Command scheduler runs one replica of the jetfleet scheduler: it serves
// the schedule API, competes for the leader lease and, while it leads,
// fires schedules. Run as many replicas as you like; see docs/scheduling.md.
package main

import (
	"context"

	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

func main() {
	cfg := scheduler.DefaultServiceConfig()
	service.Main("scheduler", cfg, func(ctx context.Context, env *service.Env, http *telemetry.HTTPServer) (lifecycle.Component, error) {
		// cfg is loaded by now: read the scheduler section here, not before Main.
		return scheduler.BuildFunc(cfg.Scheduler)(ctx, env, http)
	})
}
