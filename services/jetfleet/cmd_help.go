package main

import (
	"context"
	"flag"
)

func init() {
	register(&command{name: "help", args: "[command [subcommand]]", summary: "show the usage of jetfleet or of a command",
		setup: func(*flag.FlagSet) action {
			return func(_ context.Context, inv *invocation) error { return helpFor(root, inv.args, inv.out) }
		}})
}
