package identity_test

import (
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/identity/identitytest"
	"github.com/relaymesh/relaymesh/server/servertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// replica is one address of the relay server as an agent sees it: a TCP
// proxy to the real server that lets each connection through after delay
// (a server busy with a storm of handshakes), or, silent, accepts and never
// answers (a hung replica). It counts the connections it accepted.
type replica struct {
	addr     string
	accepted atomic.Int32
}

func startReplica(t *testing.T, target string, delay time.Duration, silent bool) *replica {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &replica{addr: lis.Addr().String()}
	done := make(chan struct{})
	t.Cleanup(func() { _ = lis.Close(); close(done) })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			r.accepted.Add(1)
			go func() {
				defer c.Close()
				if silent {
					_, _ = io.Copy(io.Discard, c)
					return
				}
				select {
				case <-time.After(delay):
				case <-done:
					return
				}
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	return r
}

// Three replicas, each as slow to start a handshake as a server in a storm
// (600 ms): the bootstrap makes one connection, to one of them. Handed the
// whole list, gRPC's pick_first dialled the next replica after 250 ms, and
// the next: three handshakes for one certificate, when the servers are
// busiest.
func TestACallDialsOneReplica(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	var replicas []*replica
	var addrs []string
	for range 3 {
		r := startReplica(t, srv.Addr, 600*time.Millisecond, false)
		replicas = append(replicas, r)
		addrs = append(addrs, r.addr)
	}
	secrets := identitytest.NewMemAgentSecrets(srv.RootsPEM, srv.Mint("cluster-1", time.Hour))
	m, _ := runManager(t, identity.ManagerConfig{Cluster: "cluster-1", ServerAddress: strings.Join(addrs, ","), ServerName: "localhost", Secrets: secrets})
	select {
	case <-m.Ready():
	case <-time.After(15 * time.Second):
		t.Fatalf("not ready: %+v", m.Status())
	}
	var total int32
	for _, r := range replicas {
		total += r.accepted.Load()
	}
	assert.Equal(t, int32(1), total, "connections for one bootstrap, all replicas")
}

// A replica that is down and one that accepts and stays silent: a call
// that meets one fails, within the connect timeout, and the next call goes
// to the next replica, so the agent is certified by the one that serves,
// whichever replica it starts at, having dialled the silent one at most
// once.
func TestCallsMoveToTheNextReplica(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	silent := startReplica(t, srv.Addr, 0, true)
	serving := startReplica(t, srv.Addr, 0, false)
	// Closed after the others listen, so neither can be given its port.
	down, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	downAddr := down.Addr().String()
	require.NoError(t, down.Close())

	for first, silentCalls := range []int32{1, 1, 0} {
		secrets := identitytest.NewMemAgentSecrets(srv.RootsPEM, srv.Mint("cluster-1", time.Hour))
		silentBefore, servingBefore := silent.accepted.Load(), serving.accepted.Load()
		start := time.Now()
		m, _ := runManager(t, identity.ManagerConfig{Cluster: "cluster-1", ServerAddress: strings.Join([]string{downAddr, silent.addr, serving.addr}, ","),
			ServerName: "localhost", Secrets: secrets, FirstReplica: func(int) int { return first }})
		select {
		case <-m.Ready():
		case <-time.After(20 * time.Second):
			t.Fatalf("starting at replica %d: not ready: %+v", first, m.Status())
		}
		assert.Less(t, time.Since(start), 10*time.Second, "starting at replica %d: two failed calls at most", first)
		assert.Equal(t, silentCalls, silent.accepted.Load()-silentBefore, "starting at replica %d: calls to the silent replica", first)
		assert.Equal(t, int32(1), serving.accepted.Load()-servingBefore, "starting at replica %d: connections to the serving replica", first)
	}
}
