package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestRun(t *testing.T) {
	tests := []struct {
		args     []string
		code     int
		out, err string
	}{
		{[]string{"version"}, 0, "relaymesh ", ""},
		{[]string{"--help"}, 0, "Usage:", ""},
		{nil, 2, "", "Usage:"},
		{[]string{"serve"}, 2, "", `unknown command "serve"`},
	}
	for _, tt := range tests {
		var out, errOut bytes.Buffer
		assert.Equal(t, tt.code, run(tt.args, &out, &errOut), "args %v", tt.args)
		assert.Contains(t, out.String(), tt.out)
		assert.Contains(t, errOut.String(), tt.err)
	}
}
