package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// rootHelp follows the command list of 'jetfleet -h'.
const rootHelp = `Flags go before or after arguments; '--' ends them. Every command and subcommand takes -h.

Commands that talk to a fleet connect to -server ($NATS_URL, default nats://127.0.0.1:4222) with one of
-user and -password ($NATS_USER, $NATS_PASSWORD), -token ($NATS_TOKEN), -creds ($NATS_CREDS) or -nkey
($NATS_NKEY). Each flag defaults to its environment variable; prefer the variables for secrets.

-o table (the default) or -o json chooses the output. In JSON, every duration is a string of seconds with an
"s" suffix ("1.5s", "30s"), the proto3 JSON form, and times are RFC 3339.

Exit status: 0 done; 1 failed or refused (a dead letter replayed before, a purge that found nothing to purge,
a trigger the overlap policy skipped, a run that 'workflow run -wait' saw fail); 2 a usage error (a missing
argument, an unknown command or flag, a bad flag value).

Run 'jetfleet help <command>' or 'jetfleet <command> -h' for a command's flags.
'jetfleet completion bash|zsh' prints a shell completion script.`

// printUsage prints a group's usage: its commands.
func (c *command) printUsage(w io.Writer) {
	if c == root {
		fmt.Fprintln(w, "usage: jetfleet <command> [subcommand] [flags] [args]")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "jetfleet runs, feeds and inspects a job fleet on NATS JetStream.")
	} else {
		fmt.Fprintf(w, "usage: %s <%s> [flags] [args]\n\n%s\n", c.title(), strings.Join(c.subNames(), "|"), c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	width := 0
	for _, s := range c.subs {
		width = max(width, len(s.name))
	}
	for _, s := range c.subs {
		fmt.Fprintf(w, "  %-*s  %s\n", width, s.name, s.summary)
	}
	fmt.Fprintln(w)
	if c == root {
		fmt.Fprintln(w, rootHelp)
		return
	}
	fmt.Fprintf(w, "Run '%s <command> -h' for a command's flags.\n", c.title())
}

// connectionFlags are listed apart in a command's help.
var connectionFlags = map[string]bool{"server": true, "user": true, "password": true, "token": true, "creds": true,
	"nkey": true, "timeout": true}

// printHelp prints a command's usage and flags.
func (c *command) printHelp(w io.Writer, fs *flag.FlagSet) {
	args := c.args
	if args != "" {
		args = " " + args
	}
	fmt.Fprintf(w, "usage: %s [flags]%s\n\n%s\n", c.title(), args, c.summary)
	if c.help != "" {
		fmt.Fprintln(w, c.help)
	}
	var own, conn []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if connectionFlags[f.Name] {
			conn = append(conn, f)
		} else {
			own = append(own, f)
		}
	})
	if len(own) > 0 {
		fmt.Fprintln(w, "\nflags:")
		printFlags(w, own)
	}
	if len(conn) > 0 {
		fmt.Fprintln(w, "\nconnection flags (each defaults to its environment variable):")
		printFlags(w, conn)
	}
}

// printFlags lists flags the way flag.PrintDefaults does.
func printFlags(w io.Writer, flags []*flag.Flag) {
	for _, f := range flags {
		var b strings.Builder
		fmt.Fprintf(&b, "  -%s", f.Name)
		name, usage := flag.UnquoteUsage(f)
		if name != "" {
			b.WriteString(" " + name)
		}
		if b.Len() <= 4 { // a one-letter bool flag fits on the line
			b.WriteString("\t")
		} else {
			b.WriteString("\n    \t")
		}
		b.WriteString(strings.ReplaceAll(usage, "\n", "\n    \t"))
		switch def := f.DefValue; {
		case def == "" || def == "0" || def == "false" || def == "0s" || def == "[]":
		case fmt.Sprintf("%T", f.Value) == "*flag.stringValue":
			fmt.Fprintf(&b, " (default %q)", def)
		default:
			fmt.Fprintf(&b, " (default %s)", def)
		}
		fmt.Fprintln(w, b.String())
	}
}
