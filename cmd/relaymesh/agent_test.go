package main

import (
	"bytes"
	"log/slog"
	"net"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A second agent on one machine (by-hand use) finds the default operations
// address held by the first: it takes a free loopback port and logs it. An
// address given explicitly is never replaced: that is an error naming the
// flag.
func TestASecondAgentOnOneMachineTakesAnotherPort(t *testing.T) {
	first, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer first.Close()
	held := first.Addr().String()

	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	second, err := listenOps("--metrics-listen", held, held, log)
	require.NoError(t, err, "the default, held: another port")
	defer second.Close()
	host, _, _ := net.SplitHostPort(second.Addr().String())
	assert.Equal(t, "127.0.0.1", host, "loopback only")
	assert.NotEqual(t, held, second.Addr().String())
	assert.Contains(t, logs.String(), "listening on a free loopback port instead")
	assert.Contains(t, logs.String(), second.Addr().String(), "the address taken is logged")

	_, err = listenOps("--metrics-listen", held, "127.0.0.1:9977", log)
	require.Error(t, err, "an explicit address is never replaced")
	assert.Contains(t, err.Error(), "give each agent its own --metrics-listen")

	_, err = listenOps("--health-listen", "not-an-address", defaultAgentHealth, log)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--health-listen not-an-address")
}

// The defaults are loopback: by hand, nothing is served to the network
// unless asked.
func TestAgentOperationsDefaultToLoopback(t *testing.T) {
	for _, addr := range []string{defaultAgentHealth, defaultAgentMetrics} {
		host, _, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		assert.True(t, net.ParseIP(host).IsLoopback(), addr)
	}
}

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
