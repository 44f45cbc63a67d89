// Command jetfleet is the fleet's command-line tool: it runs the whole fleet
// in one process for development (jetfleet dev), publishes jobs, manages
// schedules and dead letters, and shows the fleet's state.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/jetfleet/jetfleet/pkg/bench"
)

func main() {
	bench.RunChildServerIfAsked() // jetfleet bench runs its delayed scenario's server so
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "jetfleet:", err)
		var ue *usageError
		if errors.As(err, &ue) {
			fmt.Fprintln(os.Stderr, ue.hint())
		}
	}
	os.Exit(exitCode(err))
}

// exitCode is 0 for success (-h included), 2 for a usage error and 1 for
// anything else: a failure, or an action the fleet refused.
func exitCode(err error) int {
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		return 2
	}
	return 1
}
