package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRunRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	keep := filepath.Join(dir, "keep")
	require.NoError(t, os.WriteFile(keep, nil, 0o600))
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "a command is required"},
		{"unknown command", []string{"sideways", "--dir", dir}, `unknown command "sideways"`},
		{"missing dir", []string{"up"}, "--dir is required"},
		{"bad cluster name", []string{"up", "--dir", dir, "--clusters", "Mgmt"}, "not a DNS label"},
		{"duplicate cluster", []string{"up", "--dir", dir, "--clusters", "a,a"}, "listed twice"},
		{"unknown flag", []string{"up", "--dri", dir}, "flag provided but not defined"},
		{"extra argument", []string{"down", "--dir", dir, "now"}, "unexpected arguments"},
		{"down without state", []string{"down", "--dir", dir}, "no local clusters recorded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tt.args, &out, &errOut)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.FileExists(t, keep, "bad input must change nothing")
		})
	}
}

func TestHelp(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"--help"}, &out, &out))
	assert.Contains(t, out.String(), "Usage: localcluster up|down")
	assert.Contains(t, out.String(), "-clusters")
}
