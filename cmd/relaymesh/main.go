// Command relaymesh is Relaymesh's single binary: the management server, the
// relay agent, and the admin commands. It only parses flags and wires the
// packages together; the logic lives in ca/, identity/, relay/, check/ and
// the other top-level packages.
//
// The command tree is built with spf13/cobra, like kubectl, istioctl and
// helm: shell completion (relaymesh completion bash|zsh|fish|powershell),
// kubeconfig loading through client-go's standard rules (--kubeconfig,
// KUBECONFIG, ~/.kube/config, --context; --mgmt-context and --remote-context
// where two clusters are involved) and -o table|wide|json|yaml wherever
// objects are printed. docs/cli.md is generated from the tree
// (relaymesh docs).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// usageError marks an error in how the command was called: bad flags or
// arguments. It exits 2 and points at --help.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef returns a usageError.
func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// exitCodeError ends the command with a code after it printed its result
// (check: 1 for warnings, 2 for errors); it prints no message of its own.
type exitCodeError struct{ code int }

func (e exitCodeError) Error() string { return fmt.Sprintf("exit code %d", e.code) }

// deps are what the commands take from their environment, injected so
// tests can replace them.
type deps struct {
	stdout, stderr io.Writer
	// stdin is what `-f -` reads; nil: os.Stdin.
	stdin io.Reader
	// now is the clock of the admin commands (check, debug report).
	now func() time.Time
	// agentClock is the clock the agent reports to the server in Hello.
	agentClock func() time.Time
}

func defaultDeps(stdout, stderr io.Writer) deps {
	return deps{stdout: stdout, stderr: stderr, now: time.Now, agentClock: time.Now}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runWith(ctx, defaultDeps(stdout, stderr), args)
}

// runWith runs the command line args and returns the exit code.
func runWith(ctx context.Context, d deps, args []string) int {
	root := newRootCommand(d)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	var code exitCodeError
	if errors.As(err, &code) {
		return code.code
	}
	path := "relaymesh"
	if cmd != nil {
		path = cmd.CommandPath()
	}
	fmt.Fprintf(d.stderr, "%s: %v\n", path, err)
	if isUsage(err) {
		fmt.Fprintf(d.stderr, "Run '%s --help' for usage.\n", path)
		return exitUsage
	}
	return exitError
}

// isUsage reports whether err is about how the command was called,
// including cobra's own errors for unknown commands and flags.
func isUsage(err error) bool {
	var u usageError
	if errors.As(err, &u) {
		return true
	}
	msg := err.Error()
	for _, prefix := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "flag needs an argument", "invalid argument", "bad flag syntax"} {
		if strings.HasPrefix(msg, prefix) {
			return true
		}
	}
	return false
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

// groupCommand is a command that only holds subcommands: run without one,
// or with an unknown one, it is a usage error naming the subcommands.
func groupCommand(use, short, long, example string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use: use, Short: short, Long: long, Example: example,
		Args: cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			var names []string
			for _, s := range c.Commands() {
				if s.IsAvailableCommand() {
					names = append(names, s.Name())
				}
			}
			if len(args) == 0 {
				return usagef("want a subcommand: %s", strings.Join(names, ", "))
			}
			return usagef("unknown subcommand %q: want %s", args[0], strings.Join(names, ", "))
		},
	}
	c.AddCommand(subs...)
	return c
}

// exactArgs wants exactly n positional arguments, named in the message.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("want %s, got %d argument(s)", what, len(args))
		}
		return nil
	}
}

// noArgs refuses positional arguments.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) != 0 {
		return usagef("want no arguments, got %q", args)
	}
	return nil
}
