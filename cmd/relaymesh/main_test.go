package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunFlags covers the commands' handling of bad input that needs no
// cluster: each refuses with a clear message and a non-zero exit (2 for
// wrong usage, 1 for a failure).
func TestRunFlags(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "audit.log")
	assert.NoError(t, os.WriteFile(good, nil, 0o600))
	missing := filepath.Join(dir, "missing")
	tests := []struct {
		name     string
		args     []string
		code     int
		out, err string
	}{
		{"version client", []string{"version", "--client"}, 0, "client     " + version(), ""},
		{"version client json", []string{"version", "--client", "-o", "json"}, 0, `"component": "client"`, ""},
		{"version without cluster", []string{"version", "--kubeconfig", missing}, 1, "client", "no such file"},
		{"help", []string{"--help"}, 0, "Available Commands:", ""},
		{"help command", []string{"help", "cluster", "register"}, 0, "relaymesh cluster register NAME [flags]", ""},
		{"no command", nil, 2, "", "Available Commands:"},
		{"unknown command", []string{"serve"}, 2, "", `unknown command "serve"`},
		{"server without audit log", []string{"server"}, 2, "", "--audit-log is required"},
		{"server half a provided CA", []string{"server", "--audit-log", good, "--ca-cert", "x"}, 2, "", "--ca-cert, --ca-key and --ca-roots go together"},
		{"server root renew-at out of range", []string{"server", "--audit-log", good, "--relay-root-renew-at", "0.95"}, 2, "", "--relay-root-renew-at 0.95: must be 0 (no automatic start) or in [0.1, 0.9]"},
		{"server root renew-at malformed", []string{"server", "--audit-log", good, "--relay-root-renew-at", "two-thirds"}, 2, "", `invalid argument "two-thirds" for "--relay-root-renew-at"`},
		{"server root grace too short", []string{"server", "--audit-log", good, "--agent-cert-ttl", "1h", "--relay-root-grace", "1h"}, 2, "",
			"--relay-root-grace 1h0m0s: shorter than --agent-cert-ttl 1h0m0s plus two --relay-issuer-check-interval 1m0s (1h2m0s)"},
		{"server root grace negative", []string{"server", "--audit-log", good, "--relay-root-grace", "-1s"}, 2, "", "--relay-root-grace -1s: must not be negative"},
		{"server root grace malformed", []string{"server", "--audit-log", good, "--relay-root-grace", "1 day"}, 2, "", `invalid argument "1 day" for "--relay-root-grace"`},
		{"server stray argument", []string{"server", "now"}, 2, "", `want no arguments, got ["now"]`},
		{"server unknown flag", []string{"server", "--tls=false"}, 2, "", "unknown flag: --tls"},
		{"server help", []string{"server", "--help"}, 0, "relaymesh server [flags]", ""},
		{"agent without cluster", []string{"agent", "--kubeconfig", missing}, 1, "", "kubeconfig"},
		{"agent bad leader timing", []string{"agent", "--leader-retry-period", "20s"}, 2, "", "0 < --leader-retry-period < --leader-renew-deadline"},
		{"two kubeconfigs", []string{"agent", "--kubeconfig", "a", "--kubeconfig", "b"}, 2, "", "--kubeconfig given 2 times"},
		{"cluster no verb", []string{"cluster"}, 2, "", "want a subcommand: deregister, list, re-bootstrap, register"},
		{"cluster unknown verb", []string{"cluster", "join"}, 2, "", `unknown subcommand "join"`},
		{"cluster bad name", []string{"cluster", "register", "Bad_Name", "--mgmt-kubeconfig", "x"}, 2, "", "not a DNS label"},
		{"cluster two names", []string{"cluster", "register", "a", "b"}, 2, "", "exactly one cluster NAME"},
		{"cluster register no server address", []string{"cluster", "register", "c1", "--mgmt-kubeconfig", "x"}, 2, "", "--server-address is required"},
		{"cluster register no workload cluster", []string{"cluster", "register", "c1", "--kubeconfig", missing, "--server-address", "h:1"}, 2, "", "no workload cluster: give --remote-context"},
		{"cluster register bad address", []string{"cluster", "register", "c1", "--mgmt-kubeconfig", "x", "--remote-kubeconfig", "y", "--server-address", "nohost"}, 2, "", "missing port"},
		{"cluster register ttl too long", []string{"cluster", "register", "c1", "--mgmt-kubeconfig", "x", "--remote-kubeconfig", "y", "--server-address", "h:1", "--token-ttl", "200h"}, 2, "", "out of range"},
		{"cluster register bad mode", []string{"cluster", "register", "c1", "--mgmt-kubeconfig", "x", "--remote-kubeconfig", "y", "--mode", "ssh"}, 2, "", `--mode "ssh": want relay or kubeconfig`},
		{"cluster register kubeconfig mode needs remote", []string{"cluster", "register", "c1", "--kubeconfig", missing, "--mode", "kubeconfig"}, 2, "", "no workload cluster"},
		{"cluster register bad trust domain", []string{"cluster", "register", "c1", "--mgmt-kubeconfig", "x", "--remote-kubeconfig", "y", "--server-address", "h:1", "--trust-domain", "Cluster.Local"}, 2, "", `--trust-domain "Cluster.Local": "Cluster.Local" is not a SPIFFE trust domain`},
		{"cluster register empty trust domain", []string{"cluster", "register", "c1", "--mgmt-kubeconfig", "x", "--remote-kubeconfig", "y", "--server-address", "h:1", "--trust-domain", ""}, 2, "", `--trust-domain "": empty`},
		{"cluster register oversized trust domain", []string{"cluster", "register", "c1", "--mgmt-kubeconfig", "x", "--remote-kubeconfig", "y", "--server-address", "h:1", "--trust-domain", strings.Repeat("a", 256)}, 2, "", "256 bytes, at most 255"},
		{"cluster register trust domain twice", []string{"cluster", "register", "c1", "--mgmt-kubeconfig", "x", "--remote-kubeconfig", "y", "--server-address", "h:1", "--trust-domain", "a.local", "--trust-domain", "a.local"}, 2, "", `--trust-domain "a.local" is given twice`},
		{"cluster register trust domain shared and not", []string{"cluster", "register", "c1", "--mgmt-kubeconfig", "x", "--remote-kubeconfig", "y", "--server-address", "h:1", "--trust-domain", "a.local", "--shared-trust-domain", "a.local"}, 2, "", "both as --trust-domain and as --shared-trust-domain"},
		{"cluster list bad output", []string{"cluster", "list", "-o", "xml"}, 2, "", `-o "xml": want table, wide, json, yaml`},
		{"token no verb", []string{"token"}, 2, "", "want a subcommand: create"},
		{"token no cluster", []string{"token", "create"}, 2, "", "--cluster is required"},
		{"token ttl negative", []string{"token", "create", "--cluster", "c", "--ttl", "-1h"}, 2, "", "out of range"},
		{"audit no file", []string{"audit", "verify"}, 2, "", "want at least one audit log FILE, got 0"},
		{"audit missing file", []string{"audit", "verify", filepath.Join(dir, "nope")}, 1, "", "no such file"},
		{"audit empty file", []string{"audit", "verify", good}, 0, "0 records verified", ""},
		{"ca no verb", []string{"ca"}, 2, "", "want a subcommand: federation, relay, rotate, status, verify"},
		{"ca status two names", []string{"ca", "status", "a/b", "c/d"}, 2, "", "want at most one NAMESPACE/VIRTUALMESH"},
		{"ca one cluster", []string{"ca", "verify", "--remote-context", "a"}, 2, "", "found 1 workload cluster(s); ca verify needs at least two"},
		{"ca missing kubeconfig", []string{"ca", "verify", "--kubeconfig", filepath.Join(dir, "a"), "--kubeconfig", filepath.Join(dir, "b")}, 1, "", "no such file"},
		{"ca kubeconfigs and contexts", []string{"ca", "verify", "--kubeconfig", "a", "--kubeconfig", "b", "--remote-context", "c"}, 2, "", "not both"},
		{"webhook url without listen", []string{"server", "--audit-log", good, "--webhook-url", "https://127.0.0.1:1/validate"}, 2, "", "need --webhook-listen"},
		{"check bad output", []string{"check", "-o", "xml"}, 2, "", `-o "xml"`},
		{"check without cluster", []string{"check", "--kubeconfig", missing}, 2, "", "management cluster"},
		{"debug no verb", []string{"debug"}, 2, "", "want a subcommand: report"},
		{"debug report bad log file", []string{"debug", "report", "--log-file", "server"}, 2, "", `--log-file "server": want NAME=VALUE`},
		{"debug report log file twice", []string{"debug", "report", "--log-file", "a=x", "--log-file", "a=y"}, 2, "", "--log-file a given twice"},
		{"debug report log name with a path", []string{"debug", "report", "--log-file", "../a=x"}, 2, "", "want NAME=VALUE"},
		{"debug report bad agent address", []string{"debug", "report", "--agent-metrics-address", "cluster-1"}, 2, "", "want NAME=VALUE"},
		{"debug report without cluster", []string{"debug", "report", "--kubeconfig", missing, "--out", filepath.Join(dir, "r.tgz")}, 1, "", "management cluster"},
		{"completion no shell", []string{"completion"}, 2, "", "want one shell"},
		{"completion bad shell", []string{"completion", "tcsh"}, 2, "", `unknown shell "tcsh"`},
		{"server bad log level", []string{"server", "--audit-log", good, "--log-level", "verbose", "--kubeconfig", missing}, 2, "", `--log-level "verbose": want debug, info, warn or error`},
		{"server bad trust domain", []string{"server", "--audit-log", good, "--trust-domain", "Not A Domain", "--kubeconfig", missing}, 2, "", "--trust-domain"},
		{"agent without cluster name", []string{"agent", "--kubeconfig", missing, "--leader-elect=false"}, 1, "", "no such file"},
		{"agent bad log level", []string{"agent", "--kubeconfig", missing, "--log-level", "loud"}, 2, "", `--log-level "loud"`},
		{"deregister bad name", []string{"cluster", "deregister", "Bad_Name"}, 2, "", "not a DNS label"},
		{"token bad cluster", []string{"token", "create", "--cluster", "Bad_Name"}, 2, "", "not a DNS label"},
		// cluster re-bootstrap: each refusal comes before any cluster is
		// reached (the kubeconfig named does not exist), so nothing is minted.
		{"re-bootstrap no name", []string{"cluster", "re-bootstrap", "--kubeconfig", missing}, 2, "", "exactly one cluster NAME"},
		{"re-bootstrap two names", []string{"cluster", "re-bootstrap", "a", "b", "--kubeconfig", missing}, 2, "", "exactly one cluster NAME"},
		{"re-bootstrap bad name", []string{"cluster", "re-bootstrap", "Bad_Name", "--kubeconfig", missing}, 2, "", "not a DNS label"},
		{"re-bootstrap path name", []string{"cluster", "re-bootstrap", "../kube-system", "--kubeconfig", missing}, 2, "", "not a DNS label"},
		{"re-bootstrap oversized name", []string{"cluster", "re-bootstrap", strings.Repeat("a", 4096), "--kubeconfig", missing}, 2, "", "not a DNS label"},
		{"re-bootstrap empty name", []string{"cluster", "re-bootstrap", "", "--kubeconfig", missing}, 2, "", "not a DNS label"},
		{"re-bootstrap no workload cluster", []string{"cluster", "re-bootstrap", "c1", "--kubeconfig", missing}, 2, "", "no workload cluster: give --remote-context"},
		{"re-bootstrap ttl too long", []string{"cluster", "re-bootstrap", "c1", "--kubeconfig", missing, "--dry-run", "--token-ttl", "200h"}, 2, "", "--token-ttl 200h0m0s out of range"},
		{"re-bootstrap ttl zero", []string{"cluster", "re-bootstrap", "c1", "--kubeconfig", missing, "--dry-run", "--token-ttl", "0s"}, 2, "", "out of range"},
		{"re-bootstrap ttl not a duration", []string{"cluster", "re-bootstrap", "c1", "--kubeconfig", missing, "--token-ttl", "soon"}, 2, "", "invalid argument"},
		{"re-bootstrap empty remote namespace", []string{"cluster", "re-bootstrap", "c1", "--kubeconfig", missing, "--dry-run", "--remote-namespace", ""}, 2, "", "namespaces must not be empty"},
		{"re-bootstrap output without dry run", []string{"cluster", "re-bootstrap", "c1", "--kubeconfig", missing, "-o", "json"}, 2, "", "-o prints the Secrets of --dry-run"},
		{"re-bootstrap bad output", []string{"cluster", "re-bootstrap", "c1", "--kubeconfig", missing, "--dry-run", "-o", "table"}, 2, "", `-o "table": want yaml, json`},
		{"re-bootstrap takes no server address", []string{"cluster", "re-bootstrap", "c1", "--server-address", "h:1"}, 2, "", "unknown flag: --server-address"},
		{"re-bootstrap management cluster unreachable", []string{"cluster", "re-bootstrap", "c1", "--kubeconfig", missing, "--dry-run"}, 1, "", "management cluster"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			assert.Equal(t, tt.code, run(context.Background(), tt.args, &out, &errOut), "stderr: %s", errOut.String())
			assert.Contains(t, out.String(), tt.out)
			assert.Contains(t, errOut.String(), tt.err)
		})
	}
}

// Every command's help has an example and a description; every command
// that prints objects takes -o with table, wide, json and yaml.
func TestEveryCommandHasAnExample(t *testing.T) {
	root := newRootCommand(defaultDeps(&bytes.Buffer{}, &bytes.Buffer{}))
	root.InitDefaultHelpCmd()
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		n++
		assert.NotEmpty(t, strings.TrimSpace(c.Example), "%s has no example", c.CommandPath())
		assert.NotEmpty(t, c.Short, "%s has no summary", c.CommandPath())
		if f := c.Flags().Lookup("output"); f != nil {
			assert.Equal(t, "o", f.Shorthand, c.CommandPath())
			formats := []string{"table", "wide", "json", "yaml"}
			if c.CommandPath() == "relaymesh cluster register" || c.CommandPath() == "relaymesh cluster re-bootstrap" {
				formats = []string{"json", "yaml"} // they print manifests to apply (--dry-run), not a listing
			}
			for _, format := range formats {
				assert.Contains(t, f.Usage, format, "%s -o", c.CommandPath())
			}
		}
		var out bytes.Buffer
		c.SetOut(&out)
		require.NoError(t, c.Help())
		assert.Contains(t, out.String(), "Examples:", c.CommandPath())
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	assert.Greater(t, n, 20)
	for _, path := range [][]string{{"cluster", "list"}, {"ca", "status"}, {"ca", "verify"}, {"check"}, {"debug", "report"}, {"version"}, {"describe"}, {"policy", "audit"}} {
		c, _, err := root.Find(path)
		require.NoError(t, err)
		assert.NotNil(t, c.Flags().Lookup("output"), "%v has no -o", path)
	}
}

// The completion scripts generate for every shell, and complete
// subcommands and output formats.
func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "__start_relaymesh", "zsh": "#compdef relaymesh", "fish": "complete -c relaymesh", "powershell": "Register-ArgumentCompleter"} {
		var out, errOut bytes.Buffer
		require.Equal(t, 0, run(context.Background(), []string{"completion", shell}, &out, &errOut), errOut.String())
		assert.Contains(t, out.String(), want, shell)
	}
	// The hidden __complete command is what the scripts call.
	for args, want := range map[string][]string{
		"__complete cluster ":               {"register", "re-bootstrap", "deregister", "list"},
		"__complete cluster list -o ":       {"table", "wide", "json", "yaml"},
		"__complete describe ":              {"destination", "workload", "policy"},
		"__complete server --log-level ":    {"debug", "info"},
		"__complete completion ":            {"bash", "zsh", "fish"},
		"__complete ca rotate ":             {"start", "continue", "rollback"},
		"__complete policy audit --output ": {"html", "json"},
	} {
		var out, errOut bytes.Buffer
		require.Equal(t, 0, run(context.Background(), strings.Split(args, " "), &out, &errOut), errOut.String())
		for _, w := range want {
			assert.Regexp(t, `(?m)^`+w+`(\t|$)`, out.String(), args)
		}
	}
}

// docs/cli.md is what the command tree generates (make verify runs the
// same comparison through relaymesh docs --check).
func TestCLIDocsFresh(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"docs"}, &out, &errOut), errOut.String())
	have, err := os.ReadFile("../../docs/cli.md")
	require.NoError(t, err)
	assert.Equal(t, out.String(), string(have), "docs/cli.md is stale: go run ./cmd/relaymesh docs > docs/cli.md")
	assert.Contains(t, out.String(), "## relaymesh check")
	assert.Contains(t, out.String(), "## relaymesh debug report")
	assert.Equal(t, 0, run(context.Background(), []string{"docs", "--check", "../../docs/cli.md"}, &out, &errOut), errOut.String())

	stale := filepath.Join(t.TempDir(), "cli.md")
	require.NoError(t, os.WriteFile(stale, []byte(strings.Replace(string(have), "relaymesh", "relaymash", 1)), 0o600))
	errOut.Reset()
	assert.Equal(t, 1, run(context.Background(), []string{"docs", "--check", stale}, &out, &errOut))
	assert.Contains(t, errOut.String(), "is stale")
}
