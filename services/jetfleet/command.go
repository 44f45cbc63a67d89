package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// command is a jetfleet command, or a subcommand of a group such as dlq.
// Each top-level command lives in its own cmd_<name>.go file and registers
// itself from init.
type command struct {
	name string
	// args shows the positional arguments in usage: "<sequence> | -all | [filter flags]".
	args string
	// summary is one line, shown in listings and by -h; help, when set, is
	// shown below it by -h.
	summary, help string
	// fleet adds the connection flags; output adds -o table|json.
	fleet, output bool
	// setup defines the command's own flags on fs and returns what runs once
	// they are parsed. A group has subs instead.
	setup func(fs *flag.FlagSet) action
	// subs are a group's subcommands, in the order usage lists them.
	subs   []*command
	parent *command
}

// action runs a command once its flags are parsed.
type action func(ctx context.Context, inv *invocation) error

// root is jetfleet itself: the group of every command.
var root = &command{name: "jetfleet"}

func register(c *command) {
	if root.sub(c.name) != nil {
		panic("jetfleet: command registered twice: " + c.name)
	}
	adopt(root, c)
	slices.SortFunc(root.subs, func(a, b *command) int { return strings.Compare(a.name, b.name) })
}

func adopt(parent, c *command) {
	c.parent = parent
	parent.subs = append(parent.subs, c)
	subs := c.subs
	c.subs = nil
	for _, s := range subs {
		adopt(c, s)
	}
}

func (c *command) sub(name string) *command {
	for _, s := range c.subs {
		if s.name == name {
			return s
		}
	}
	return nil
}

// path is the command as typed after "jetfleet": "dlq replay".
func (c *command) path() string {
	if c.parent == nil {
		return ""
	}
	if p := c.parent.path(); p != "" {
		return p + " " + c.name
	}
	return c.name
}

// title is "jetfleet dlq replay".
func (c *command) title() string { return strings.TrimSpace("jetfleet " + c.path()) }

func (c *command) subNames() []string {
	names := make([]string, len(c.subs))
	for i, s := range c.subs {
		names[i] = s.name
	}
	return names
}

// invocation is one run of a command: its parsed arguments and where it prints.
type invocation struct {
	cmd *command
	// args are the positional arguments; raw every argument after the command's name.
	args, raw []string
	out       io.Writer
	// conn holds the connection flags of a fleet command.
	conn *clientFlags
	// format is -o of a command with output.
	format string
}

// errRefused marks an action the fleet did not do because of the state it
// found (a dead letter replayed before, a trigger the overlap policy
// skipped). The command exits with status 1.
var errRefused = errors.New("refused")

// usageError is a command line that cannot run: a missing or unexpected
// argument, an unknown command or flag. It exits with status 2.
type usageError struct {
	cmd *command
	msg string
}

func (e *usageError) Error() string { return e.msg }

func usageErrorf(c *command, format string, args ...any) error {
	return &usageError{cmd: c, msg: fmt.Sprintf(format, args...)}
}

// flagValueError is a flag value a command found wrong once it ran (a
// time, a duration, a JSON payload): exec reports it as a usage error.
type flagValueError struct{ msg string }

func (e *flagValueError) Error() string { return e.msg }

func flagValueErrorf(format string, args ...any) error {
	return &flagValueError{msg: fmt.Sprintf(format, args...)}
}

// hint says where the usage of the command that failed is.
func (e *usageError) hint() string { return fmt.Sprintf("Run '%s -h' for usage.", e.cmd.title()) }

// run runs the command line args (without the program name).
func run(ctx context.Context, args []string, out io.Writer) error {
	c := root
	for len(c.subs) > 0 {
		if len(args) == 0 {
			c.printUsage(out)
			if c == root {
				return usageErrorf(c, "no command given")
			}
			return usageErrorf(c, "%s needs a subcommand: %s", c.path(), orList(c.subNames()))
		}
		switch {
		case isHelpFlag(args[0]):
			c.printUsage(out)
			return nil
		case args[0] == "help" && c != root: // jetfleet dlq help [ls]
			return helpFor(c, args[1:], out)
		}
		next, err := c.lookup(args[0])
		if err != nil {
			return err
		}
		c, args = next, args[1:]
	}
	return c.exec(ctx, args, out)
}

func isHelpFlag(arg string) bool { return arg == "-h" || arg == "--help" || arg == "-help" }

// lookup returns the subcommand name of group c, or a usage error naming it.
func (c *command) lookup(name string) (*command, error) {
	if next := c.sub(name); next != nil {
		return next, nil
	}
	if c == root {
		return nil, usageErrorf(c, "unknown command %q", name)
	}
	return nil, usageErrorf(c, "unknown %s command %q: want %s", c.path(), name, orList(c.subNames()))
}

// helpFor prints the usage of the command args name below c.
func helpFor(c *command, args []string, out io.Writer) error {
	for _, name := range args {
		if len(c.subs) == 0 {
			return usageErrorf(c, "%s has no subcommand %q", c.path(), name)
		}
		next, err := c.lookup(name)
		if err != nil {
			return err
		}
		c = next
	}
	if len(c.subs) > 0 {
		c.printUsage(out)
		return nil
	}
	fs, _, _ := c.flagSet(out)
	c.printHelp(out, fs)
	return nil
}

// flagSet defines every flag of c on a new flag set and returns it with the
// invocation the flags are read into.
func (c *command) flagSet(out io.Writer) (*flag.FlagSet, *invocation, action) {
	return c.flagSetWith(out, c.setup)
}

// flagSetWith is flagSet with the command's own flags defined by setup.
func (c *command) flagSetWith(out io.Writer, setup func(fs *flag.FlagSet) action) (*flag.FlagSet, *invocation, action) {
	fs := flag.NewFlagSet(c.title(), flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, help is printed to out
	inv := &invocation{cmd: c, out: out}
	if c.fleet {
		inv.conn = addClientFlags(fs)
	}
	if c.output {
		fs.StringVar(&inv.format, "o", "table", "output `format`: table or json (in JSON, durations are seconds with an s suffix, \"1.5s\")")
	}
	return fs, inv, setup(fs)
}

func (c *command) exec(ctx context.Context, args []string, out io.Writer) error {
	fs, inv, act := c.flagSet(out)
	pos, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		c.printHelp(out, fs)
		return nil
	}
	if err != nil {
		return usageErrorf(c, "%s: %v", c.path(), err)
	}
	if c.output && inv.format != "table" && inv.format != "json" {
		return usageErrorf(c, "%s: -o %q: want table or json", c.path(), inv.format)
	}
	inv.args, inv.raw = pos, args
	err = act(ctx, inv)
	var fe *flagValueError
	if errors.As(err, &fe) {
		return usageErrorf(c, "%s: %s", c.path(), fe.msg)
	}
	return err
}

// parseArgs parses flags anywhere among args, as kubectl and nats do
// ("schedule get nightly -o json"), and returns the other arguments. "--"
// ends the flags; a lone "-" (standard input) is an argument.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// wantArgs checks the positional arguments: names lists them in order
// ("the schedule <id>"), the first required of them mandatory. A missing
// one is named: "schedule add needs the schedule <id>".
func (inv *invocation) wantArgs(required int, names ...string) error {
	c := inv.cmd
	if n := len(inv.args); n < required {
		return usageErrorf(c, "%s needs %s", c.path(), strings.Join(names[n:required], " and "))
	}
	if extra := inv.args[min(len(inv.args), len(names)):]; len(extra) > 0 {
		if len(names) == 0 {
			return usageErrorf(c, "%s takes no arguments, got %q", c.path(), extra)
		}
		return usageErrorf(c, "%s takes %s, got %d more: %q", c.path(),
			strings.Join(names, " and "), len(extra), extra)
	}
	return nil
}

// print writes v as indented JSON with -o json, or calls table.
func (inv *invocation) print(v any, table func(w io.Writer) error) error {
	if inv.format == "json" {
		return printJSON(inv.out, v)
	}
	return table(inv.out)
}

// orList writes "a, b or c".
func orList(items []string) string {
	if len(items) <= 1 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}
