package app

import (
	"bytes"
	"log/slog"
	"net"
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
