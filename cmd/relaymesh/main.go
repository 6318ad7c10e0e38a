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

	"github.com/relaymesh/relaymesh/internal/logging"
	"github.com/spf13/cobra"
)

// Exit codes (docs/cli.md, "Exit codes"): 0 success; 1 the command could
// not do its work (a cluster unreachable, an object missing, a refusal);
// 2 the command line is wrong (an unknown command or flag, a missing or
// malformed argument or flag value) — and, for check, errors found.
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

// codedError is a failure printed like any other whose exit code is not 1:
// check exits 2, its code for errors, when it cannot read the management
// cluster at all.
type codedError struct {
	code int
	err  error
}

func (e codedError) Error() string { return e.err.Error() }
func (e codedError) Unwrap() error { return e.err }

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
	// klog (client-go) logs through the server's or agent's JSON logger
	// once it exists; set before anything logs.
	logging.InstallKlog(os.Stderr)
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
	var coded codedError
	if errors.As(err, &coded) {
		return coded.code
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

// releaseVersion is the version of a release build, set at link time
// (tools/image: -ldflags "-X main.releaseVersion=VERSION"); empty in a
// source build.
var releaseVersion string

// version is this binary's version: the release's; else the module version
// Go recorded (go install …@v1.2.3, or, built in a git checkout, the
// pseudo-version of the commit: v0.0.0-20261201165550-7507dfa924df+dirty);
// else "devel" (built without VCS information: go run, go test, or
// -buildvcs=false).
func version() string {
	if releaseVersion != "" {
		return releaseVersion
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	return versionOf(info)
}

// versionOf reads a version out of build information.
func versionOf(info *debug.BuildInfo) string {
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	b := buildOf(info)
	if b.Revision == "" {
		return "devel"
	}
	// Go records no pseudo-version for some builds (a module without a
	// go.mod version, older toolchains): make the same form from the
	// commit.
	v := "v0.0.0-"
	if b.Time != "" {
		if t, err := time.Parse(time.RFC3339, b.Time); err == nil {
			v += t.UTC().Format("20060102150405") + "-"
		}
	}
	v += b.Revision[:min(12, len(b.Revision))]
	if b.Modified {
		v += "+dirty"
	}
	return v
}

// build is what Go recorded of the checkout a binary was built from.
type build struct {
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
}

func buildOf(info *debug.BuildInfo) build {
	var b build
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
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
