package server_test

import (
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/agent/apply"
	"github.com/relaymesh/relaymesh/server"
	"github.com/stretchr/testify/assert"
)

// The pass-through source must watch exactly the kinds agents may apply.
func TestPassthroughKindsMatchApply(t *testing.T) {
	var want []string
	for _, gvk := range apply.DefaultKinds {
		want = append(want, gvk.Group+"/"+gvk.Version+"/"+strings.ToLower(gvk.Kind))
	}
	var got []string
	for _, gvr := range server.PassthroughKinds {
		got = append(got, gvr.Group+"/"+gvr.Version+"/"+strings.TrimSuffix(strings.TrimSuffix(gvr.Resource, "s"), "ie")+map[bool]string{true: "y", false: ""}[strings.HasSuffix(gvr.Resource, "ies")])
	}
	assert.Equal(t, want, got)
}
