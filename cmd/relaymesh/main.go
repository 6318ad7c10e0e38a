// Command relaymesh is Relaymesh's single binary: the management server, the
// relay agent, and the admin commands. It only parses flags and wires the
// packages together; the logic lives in ca/, identity/, relay/ and audit/.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
)

// command is one subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() map[string]command {
	return map[string]command{
		"server":  {"run the management server (relay gRPC :9900, metrics/health :9091)", runServer},
		"agent":   {"run the relay agent in a workload cluster (metrics :9977, health :9988)", runAgent},
		"cluster": {"register or deregister a workload cluster (cluster register|deregister NAME)", runCluster},
		"token":   {"mint a single-use bootstrap token (token create --cluster NAME)", runToken},
		"audit":   {"verify the hash-chained audit log (audit verify FILE)", runAudit},
		"version": {"print the version", func(_ context.Context, _ []string, stdout, _ io.Writer) error {
			fmt.Fprintln(stdout, "relaymesh", version())
			return nil
		}},
		"ca":       {"check shared trust: every mesh's CA against every other mesh's root bundle (verify)", runCA},
		"describe": {"explain which policies apply to a destination, workload or policy, and their outputs", runDescribe},
		"policy":   {"audit who can reach what (access matrix and findings)", runPolicy},
	}
}

func usage() string {
	var b strings.Builder
	b.WriteString("relaymesh: multi-cluster trust and federation for Istio meshes\n\nUsage:\n  relaymesh COMMAND [flags]\n\nCommands:\n")
	cmds := commands()
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "  %-9s %s\n", n, cmds[n].summary)
	}
	b.WriteString("\nRun 'relaymesh COMMAND --help' for a command's flags.\n")
	return b.String()
}

// errUsage marks an error whose message is the help the user asked for.
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	switch args[0] {
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage())
		return 0
	}
	cmd, ok := commands()[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "relaymesh: unknown command %q\n\n%s", args[0], usage())
		return 2
	}
	if err := cmd.run(ctx, args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "relaymesh %s: %v\n", args[0], err)
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	return 0
}

// newFlags makes a flag set whose help goes to stderr with a synopsis.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("relaymesh "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: relaymesh %s\n\n%s\n\nFlags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses flags and refuses stray positional arguments beyond want.
func parse(fs *flag.FlagSet, args []string, want int) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() != want {
		fs.Usage()
		return nil, fmt.Errorf("%w: want %d argument(s), got %d", errUsage, want, fs.NArg())
	}
	return fs.Args(), nil
}

// parsePositional parses flags and returns every positional argument,
// accepting up to lead of them before the flags (`cluster register NAME
// --flag …` as well as `cluster register --flag … NAME`).
func parsePositional(fs *flag.FlagSet, args []string, lead int) ([]string, error) {
	var pos []string
	for len(args) > 0 && len(pos) < lead && args[0] != "" && args[0][0] != '-' {
		pos, args = append(pos, args[0]), args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return append(pos, fs.Args()...), nil
}

// version is the module version, or the VCS revision for a source build.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			return "devel+" + s.Value
		}
	}
	return "devel"
}
