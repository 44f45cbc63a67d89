package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/jetfleet/jetfleet/pkg/bench"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

func init() {
	register(&command{name: "completion", args: "<bash|zsh>", summary: "print a shell completion script: completion bash|zsh",
		help: "Completes commands, subcommands, flags and the values of some flags (-o, files…).\n\n" +
			"  bash: source <(jetfleet completion bash)    # or save it in /etc/bash_completion.d/jetfleet\n" +
			"  zsh:  source <(jetfleet completion zsh)     # or save it as _jetfleet in a directory of $fpath",
		setup: func(*flag.FlagSet) action { return runCompletion }})
}

var shells = []string{"bash", "zsh"}

func runCompletion(_ context.Context, inv *invocation) error {
	if err := inv.wantArgs(1, "the <shell> ("+orList(shells)+")"); err != nil {
		return err
	}
	switch inv.args[0] {
	case "bash":
		return writeBashCompletion(inv.out)
	case "zsh":
		return writeZshCompletion(inv.out)
	}
	return usageErrorf(inv.cmd, "completion: unknown shell %q: want %s", inv.args[0], orList(shells))
}

// completed is what a script completes for one command (a leaf).
type completed struct {
	path  string // "dlq ls"
	flags []*flag.Flag
	// words complete its positional arguments.
	words []string
}

// leaves lists every command that runs, with its flags.
func leaves() []completed {
	var out []completed
	var walk func(c *command)
	walk = func(c *command) {
		if len(c.subs) > 0 {
			for _, s := range c.subs {
				walk(s)
			}
			return
		}
		fs, _, _ := c.flagSet(io.Discard)
		l := completed{path: c.path()}
		fs.VisitAll(func(f *flag.Flag) { l.flags = append(l.flags, f) })
		switch l.path {
		case "completion":
			l.words = shells
		case "config print":
			l.words = serviceNames()
		}
		out = append(out, l)
	}
	walk(root)
	return out
}

// flagWords are the values completed for a flag of this name.
func flagWords(name string) []string {
	switch name {
	case "o":
		return []string{"table", "json"}
	case "overlap":
		return []string{jetfleet.OverlapAllow, jetfleet.OverlapSkip, jetfleet.OverlapBufferOne, jetfleet.OverlapCancelPrevious}
	case "misfire":
		return []string{jetfleet.MisfireFireOnce, jetfleet.MisfireFireAll, jetfleet.MisfireSkip}
	case "scenario":
		return append([]string{"all"}, bench.Scenarios...)
	case "status":
		return workflowRunStatuses
	}
	return nil
}

// fileFlags take a file name.
var fileFlags = map[string]bool{"f": true, "creds": true, "nkey": true, "config": true, "cpuprofile": true, "input-file": true}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// repeatable flag values collect every use.
type repeatable interface{ repeatable() }

func (*listFlag) repeatable()   {}
func (*headerFlag) repeatable() {}

func flagNames(flags []*flag.Flag, keep func(*flag.Flag) bool) string {
	var names []string
	for _, f := range flags {
		if keep(f) {
			names = append(names, "-"+f.Name)
		}
	}
	return strings.Join(names, " ")
}

func writeBashCompletion(w io.Writer) error {
	var b strings.Builder
	groups := func(fn func(g *command)) {
		for _, c := range root.subs {
			if len(c.subs) > 0 {
				fn(c)
			}
		}
	}
	b.WriteString(`# bash completion for jetfleet. Load it with
#   source <(jetfleet completion bash)
# or save it as /etc/bash_completion.d/jetfleet.
_jetfleet() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
	local cmd=${COMP_WORDS[1]} key=${COMP_WORDS[1]} flags="" valued="" words=""
	COMPREPLY=()
	if ((COMP_CWORD == 1)); then
`)
	fmt.Fprintf(&b, "\t\tCOMPREPLY=($(compgen -W %q -- \"$cur\"))\n\t\treturn\n\tfi\n", strings.Join(root.subNames(), " "))
	b.WriteString("\tif [[ $cmd == help ]]; then\n\t\tcase $COMP_CWORD in\n")
	fmt.Fprintf(&b, "\t\t2) words=%q ;;\n\t\t3)\n\t\t\tcase ${COMP_WORDS[2]} in\n", strings.Join(root.subNames(), " "))
	groups(func(g *command) { fmt.Fprintf(&b, "\t\t\t%s) words=%q ;;\n", g.name, strings.Join(g.subNames(), " ")) })
	b.WriteString("\t\t\tesac\n\t\t\t;;\n\t\tesac\n\t\tCOMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n\t\treturn\n\tfi\n")
	b.WriteString("\tcase $cmd in\n")
	groups(func(g *command) {
		fmt.Fprintf(&b, "\t%s)\n\t\tif ((COMP_CWORD == 2)); then\n\t\t\tCOMPREPLY=($(compgen -W %q -- \"$cur\"))\n\t\t\treturn\n\t\tfi\n",
			g.name, strings.Join(g.subNames(), " "))
		b.WriteString("\t\tkey=\"$cmd ${COMP_WORDS[2]}\"\n\t\t;;\n")
	})
	b.WriteString("\tesac\n\tcase $key in\n")
	for _, l := range leaves() {
		fmt.Fprintf(&b, "\t%q)\n\t\tflags=%q\n\t\tvalued=%q\n", l.path, flagNames(l.flags, func(*flag.Flag) bool { return true }),
			flagNames(l.flags, func(f *flag.Flag) bool { return !isBoolFlag(f) }))
		if len(l.words) > 0 {
			fmt.Fprintf(&b, "\t\twords=%q\n", strings.Join(l.words, " "))
		}
		b.WriteString("\t\t;;\n")
	}
	b.WriteString("\tesac\n\tcase $prev in\n")
	var valueFlags []string
	seen := map[string]bool{}
	for _, l := range leaves() {
		for _, f := range l.flags {
			if !seen[f.Name] && flagWords(f.Name) != nil {
				valueFlags = append(valueFlags, f.Name)
			}
			seen[f.Name] = true
		}
	}
	slices.Sort(valueFlags)
	for _, name := range valueFlags {
		fmt.Fprintf(&b, "\t-%s)\n\t\tCOMPREPLY=($(compgen -W %q -- \"$cur\"))\n\t\treturn\n\t\t;;\n", name, strings.Join(flagWords(name), " "))
	}
	files := slices.Sorted(func(yield func(string) bool) {
		for name := range fileFlags {
			if !yield("-" + name) {
				return
			}
		}
	})
	fmt.Fprintf(&b, "\t%s)\n\t\tCOMPREPLY=($(compgen -f -- \"$cur\"))\n\t\treturn\n\t\t;;\n\tesac\n", strings.Join(files, "|"))
	b.WriteString(`	if [[ " $valued " == *" $prev "* ]]; then
		return # the value of a flag, for the user to type
	fi
	if [[ $cur == -* ]]; then
		COMPREPLY=($(compgen -W "$flags" -- "$cur"))
		return
	fi
	COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _jetfleet jetfleet
`)
	_, err := io.WriteString(w, b.String())
	return err
}

// zshQuote quotes s for a single-quoted zsh word.
func zshQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// zshDescribe lists commands as name:summary for _describe.
func zshDescribe(cmds []*command) string {
	items := make([]string, len(cmds))
	for i, c := range cmds {
		items[i] = zshQuote(c.name + ":" + c.summary)
	}
	return strings.Join(items, " ")
}

// zshSpec is the _arguments spec of a flag.
func zshSpec(f *flag.Flag) string {
	name, usage := flag.UnquoteUsage(f)
	usage = strings.NewReplacer("[", `\[`, "]", `\]`, "\n", " ").Replace(strings.SplitN(usage, "\n", 2)[0])
	spec := "-" + f.Name + "[" + usage + "]"
	if _, ok := f.Value.(repeatable); ok {
		spec = "*" + spec
	}
	if isBoolFlag(f) {
		return zshQuote(spec)
	}
	if name == "" {
		name = "value"
	}
	action := " "
	switch {
	case fileFlags[f.Name]:
		action = "_files"
	case flagWords(f.Name) != nil:
		action = "(" + strings.Join(flagWords(f.Name), " ") + ")"
	}
	return zshQuote(spec + ":" + name + ":" + action)
}

func writeZshCompletion(w io.Writer) error {
	var b strings.Builder
	b.WriteString(`#compdef jetfleet
# zsh completion for jetfleet. Load it with
#   source <(jetfleet completion zsh)
# or save it as _jetfleet in a directory of $fpath.
_jetfleet() {
	local -a commands subcommands specs
	local key
`)
	fmt.Fprintf(&b, "\tcommands=(%s)\n", zshDescribe(root.subs))
	b.WriteString("\tif (( CURRENT == 2 )); then\n\t\t_describe -t commands 'jetfleet command' commands\n\t\treturn\n\tfi\n")
	b.WriteString("\tkey=$words[2]\n\tcase $key in\n")
	b.WriteString("\thelp)\n\t\tif (( CURRENT == 3 )); then\n\t\t\t_describe -t commands 'command' commands\n\t\t\treturn\n\t\tfi\n\t\t;;\n")
	for _, g := range root.subs {
		if len(g.subs) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\t%s)\n\t\tsubcommands=(%s)\n", g.name, zshDescribe(g.subs))
		fmt.Fprintf(&b, "\t\tif (( CURRENT == 3 )); then\n\t\t\t_describe -t commands %s subcommands\n\t\t\treturn\n\t\tfi\n", zshQuote(g.name+" command"))
		b.WriteString("\t\tkey=\"$key $words[3]\"\n\t\tshift words\n\t\t(( CURRENT-- ))\n\t\t;;\n")
	}
	b.WriteString("\tesac\n\tshift words\n\t(( CURRENT-- ))\n\tcase $key in\n")
	// jetfleet help <group> <subcommand>
	b.WriteString("\thelp)\n\t\tcase $words[2] in\n")
	for _, g := range root.subs {
		if len(g.subs) > 0 {
			fmt.Fprintf(&b, "\t\t%s) subcommands=(%s) ;;\n", g.name, zshDescribe(g.subs))
		}
	}
	b.WriteString("\t\tesac\n\t\t(( CURRENT == 3 )) && _describe -t commands 'subcommand' subcommands\n\t\treturn\n\t\t;;\n")
	for _, l := range leaves() {
		if l.path == "help" {
			continue
		}
		specs := make([]string, 0, len(l.flags)+1)
		for _, f := range l.flags {
			specs = append(specs, zshSpec(f))
		}
		if len(l.words) > 0 {
			specs = append(specs, zshQuote("1:argument:("+strings.Join(l.words, " ")+")"))
		} else {
			specs = append(specs, zshQuote("*:argument: "))
		}
		fmt.Fprintf(&b, "\t%s)\n\t\tspecs=(\n\t\t\t%s\n\t\t)\n\t\t;;\n", zshQuote(l.path), strings.Join(specs, "\n\t\t\t"))
	}
	b.WriteString(`	esac
	_arguments $specs
}
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
	_jetfleet "$@"
else
	compdef _jetfleet jetfleet
fi
`)
	_, err := io.WriteString(w, b.String())
	return err
}
