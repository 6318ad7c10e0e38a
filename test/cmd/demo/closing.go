package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/relaymesh/relaymesh/check"
)

// ending is how to reach what the demo started: the binary, the clusters'
// kubeconfigs, the server and the dashboard. The demo closes by printing it.
type ending struct {
	relaymesh   string   // absolute path of the relaymesh binary
	kubeconfigs []string // absolute paths; the management cluster's first
	metrics     string   // the server's metrics and health address
	dashboard   string   // the dashboard's URL
	tokenCmd    []string // mints a sign-in token for the dashboard
	exit        bool     // DEMO_EXIT=1: everything stops right after the closing lines
}

// kubeconfig is the KUBECONFIG value that gives every command a context
// per cluster, named after it, with the management cluster's current.
func (e ending) kubeconfig() string {
	return strings.Join(e.kubeconfigs, string(filepath.ListSeparator))
}

// checkArgs are the arguments of `relaymesh check` against the demo. There
// is no Service in front of the server (it runs as a local process), so its
// metrics are read at their address rather than through the apiserver.
func (e ending) checkArgs() []string {
	return []string{"check", "--server-metrics-address", e.metrics, "--server-metrics-plain-http"}
}

// tryCheck runs the `relaymesh check` the closing lines print, the way they
// print it, and shows its report: what the demo tells the user to run works.
// No istiod runs here (there is no kubelet), so check cannot see one use the
// cacerts Relaymesh wrote: those errors are expected and said so. Any other
// error fails the demo; warnings pass.
func (e ending) tryCheck(ctx context.Context, out io.Writer) error {
	step(out, "Checking the installation: KUBECONFIG=%s relaymesh %s", e.kubeconfig(), strings.Join(e.checkArgs(), " "))
	run := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, e.relaymesh, args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+e.kubeconfig())
		return cmd.Output()
	}
	b, err := run(e.checkArgs()...)
	fmt.Fprintf(out, "%s", b)
	var exit *exec.ExitError
	switch {
	case err == nil:
		return nil
	case !errors.As(err, &exit) || exit.ExitCode() > int(check.Error):
		return fmt.Errorf("relaymesh check: %w: %s", err, exitStderr(err))
	case exit.ExitCode() < int(check.Error):
		return nil
	}
	b, err = run(append(e.checkArgs(), "-o", "json")...)
	if err != nil && !errors.As(err, &exit) {
		return fmt.Errorf("relaymesh check -o json: %w: %s", err, exitStderr(err))
	}
	var report check.Report
	if err := json.Unmarshal(b, &report); err != nil {
		return fmt.Errorf("relaymesh check -o json: %w", err)
	}
	istiod := 0
	for _, r := range report.Results {
		if r.Severity < check.Error {
			continue
		}
		if r.Area != check.AreaIstiod {
			return fmt.Errorf("relaymesh check found an error in the demo: %s %s: %s", r.Area, r.Subject, r.Message)
		}
		istiod++
	}
	fmt.Fprintf(out, "  The %d istiod errors are expected here: no istiod runs in the demo (there is no kubelet), so nothing\n", istiod)
	fmt.Fprintln(out, "  publishes the root istiod would take from the cacerts Relaymesh wrote; with a running istiod they turn OK.")
	return nil
}

// exitStderr is what a failed command wrote to stderr.
func exitStderr(err error) string {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return strings.TrimSpace(string(exit.Stderr))
	}
	return ""
}

// print writes the closing lines: the dashboard and its sign-in command,
// where relaymesh is and the commands that point it at the demo's clusters.
// With exit set nothing stays up, so it prints no address to open and says
// how to keep everything up instead.
func (e ending) print(out io.Writer) {
	if e.exit {
		step(out, "DEMO_EXIT=1: stopping the server, its dashboard, the agents and the clusters now")
		fmt.Fprintf(out, "  relaymesh is %s; run `make demo` without DEMO_EXIT to keep everything up until Ctrl-C,\n", e.relaymesh)
		fmt.Fprintln(out, "  with the dashboard's address, its sign-in command and the commands that point relaymesh at the clusters.")
		return
	}
	step(out, "The dashboard: %s", e.dashboard)
	fmt.Fprintf(out, "  Sign in with a token of the ServiceAccount relaymesh/%s (bound to the dashboard's viewer ClusterRole):\n", dashboardViewerName)
	fmt.Fprintf(out, "    %s\n", strings.Join(e.tokenCmd, " "))

	step(out, "Try it yourself, in another terminal: relaymesh is %s", e.relaymesh)
	fmt.Fprintln(out, "  One context per cluster, named after it, for relaymesh and kubectl (mgmt is the current one):")
	fmt.Fprintf(out, "    export KUBECONFIG=%s\n", e.kubeconfig())
	fmt.Fprintf(out, "    %s %s\n", e.relaymesh, strings.Join(e.checkArgs(), " "))
	fmt.Fprintf(out, "    %s cluster list\n", e.relaymesh)
	fmt.Fprintf(out, "    %s policy audit\n", e.relaymesh)
	fmt.Fprintf(out, "    %s describe policy accesspolicy/relaymesh/productpage-to-reviews\n", e.relaymesh)
}
