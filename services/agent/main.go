// Command agent runs one jetfleet agent: it pulls jobs of its queues and
// runs each with the built-in handler configured for its kind (exec: a
// program; http: a POST to a URL). Run as many as you like; see
// docs/agent.md.
package main

import (
	"github.com/jetfleet/jetfleet/pkg/agent/agentservice"
	"github.com/jetfleet/jetfleet/pkg/agent/command"
	"github.com/jetfleet/jetfleet/pkg/service"
)

func main() {
	// First: this binary is also the launcher that applies an exec
	// handler's resource limits before it becomes the configured program.
	command.RunLauncherIfRequested()
	cfg := agentservice.DefaultServiceConfig()
	service.Main("agent", cfg, agentservice.BuildFunc(cfg))
}
