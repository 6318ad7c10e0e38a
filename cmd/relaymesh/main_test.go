package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestRunFlags covers the commands' handling of bad input that needs no
// cluster: each refuses with a clear message and a non-zero exit.
func TestRunFlags(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "audit.log")
	assert.NoError(t, os.WriteFile(good, nil, 0o600))
	tests := []struct {
		name     string
		args     []string
		code     int
		out, err string
	}{
		{"version", []string{"version"}, 0, "relaymesh ", ""},
		{"help", []string{"--help"}, 0, "Commands:", ""},
		{"no command", nil, 2, "", "Commands:"},
		{"unknown command", []string{"serve"}, 2, "", `unknown command "serve"`},
		{"server without audit log", []string{"server"}, 1, "", "--audit-log is required"},
		{"server half a provided CA", []string{"server", "--audit-log", good, "--ca-cert", "x"}, 1, "", "--ca-cert, --ca-key and --ca-roots go together"},
		{"server stray argument", []string{"server", "now"}, 2, "", "want 0 argument(s)"},
		{"server unknown flag", []string{"server", "--tls=false"}, 1, "", "flag provided but not defined: -tls"},
		{"server help", []string{"server", "--help"}, 0, "", "Usage: relaymesh server"},
		{"agent without cluster", []string{"agent", "--kubeconfig", filepath.Join(dir, "missing")}, 1, "", "kubeconfig"},
		{"cluster no verb", []string{"cluster"}, 2, "", "register|deregister"},
		{"cluster bad name", []string{"cluster", "register", "Bad_Name", "--mgmt-kubeconfig", "x"}, 1, "", "not a DNS label"},
		{"cluster two names", []string{"cluster", "register", "a", "b"}, 2, "", "exactly one cluster NAME"},
		{"cluster register missing flags", []string{"cluster", "register", "c1", "--mgmt-kubeconfig", "x"}, 1, "", "--remote-kubeconfig and --server-address are required"},
		{"cluster register bad address", []string{"cluster", "register", "c1", "--mgmt-kubeconfig", "x", "--remote-kubeconfig", "y", "--server-address", "nohost"}, 1, "", "missing port"},
		{"cluster register ttl too long", []string{"cluster", "register", "c1", "--mgmt-kubeconfig", "x", "--remote-kubeconfig", "y", "--server-address", "h:1", "--token-ttl", "200h"}, 1, "", "out of range"},
		{"cluster register bad mode", []string{"cluster", "register", "c1", "--mgmt-kubeconfig", "x", "--remote-kubeconfig", "y", "--mode", "ssh"}, 1, "", `--mode "ssh": want relay or kubeconfig`},
		{"cluster register kubeconfig mode needs remote", []string{"cluster", "register", "c1", "--mgmt-kubeconfig", "x", "--mode", "kubeconfig"}, 1, "", "--remote-kubeconfig is required"},
		{"token no verb", []string{"token"}, 2, "", "token create"},
		{"token no cluster", []string{"token", "create"}, 1, "", "--cluster is required"},
		{"token ttl negative", []string{"token", "create", "--cluster", "c", "--ttl", "-1h"}, 1, "", "out of range"},
		{"audit no file", []string{"audit", "verify"}, 2, "", "want 1 argument(s)"},
		{"audit missing file", []string{"audit", "verify", filepath.Join(dir, "nope")}, 1, "", "no such file"},
		{"audit empty file", []string{"audit", "verify", good}, 0, "0 records verified", ""},
		{"ca no verb", []string{"ca"}, 2, "", "relaymesh ca status|rotate|verify"},
		{"ca status two names", []string{"ca", "status", "a/b", "c/d"}, 2, "", "want at most 1 argument(s)"},
		{"ca one cluster", []string{"ca", "verify", "--kubeconfig", "x"}, 2, "", "at least two --kubeconfig"},
		{"ca missing kubeconfig", []string{"ca", "verify", "--kubeconfig", filepath.Join(dir, "a"), "--kubeconfig", filepath.Join(dir, "b")}, 1, "", "no such file"},
		{"webhook url without listen", []string{"server", "--audit-log", good, "--webhook-url", "https://127.0.0.1:1/validate"}, 1, "", "need --webhook-listen"},
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
