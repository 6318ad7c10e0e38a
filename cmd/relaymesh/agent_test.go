package main

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

// version reads Go's build information: a module version, else the commit
// as a pseudo-version, else devel.
func TestVersionComesFromBuildInformation(t *testing.T) {
	vcs := func(kv ...string) []debug.BuildSetting {
		var out []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			out = append(out, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	for _, tt := range []struct {
		name string
		info debug.BuildInfo
		want string
	}{
		{"module version", debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, "v1.2.3"},
		{"go's pseudo-version", debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261201165550-7507dfa924df+dirty"}}, "v0.0.0-20261201165550-7507dfa924df+dirty"},
		{"commit, clean", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("vcs.revision", "7507dfa924df7ff83e04d6b28135fb9818e082ba", "vcs.time", "2026-12-01T16:55:50Z", "vcs.modified", "false")}, "v0.0.0-20261201165550-7507dfa924df"},
		{"commit, modified", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("vcs.revision", "7507dfa924df7ff83e04d6b28135fb9818e082ba", "vcs.modified", "true")}, "v0.0.0-7507dfa924df+dirty"},
		{"commit, bad time", debug.BuildInfo{Settings: vcs("vcs.revision", "abc", "vcs.time", "yesterday")}, "v0.0.0-abc"},
		{"nothing", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, versionOf(&tt.info))
		})
	}
	v := clientVersion()
	assert.Equal(t, version(), v.Version)
	assert.Contains(t, v.Source, "this binary (", "the source says where the version comes from")
}
