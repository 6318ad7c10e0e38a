package server_test

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/agent"
	"github.com/relaymesh/relaymesh/internal/backoff"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/servertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// sessionEvents records what a session's hooks saw.
type sessionEvents struct {
	mu       sync.Mutex
	events   []string
	received []uint64
	acked    []uint64
}

func (e *sessionEvents) add(s string) {
	e.mu.Lock()
	e.events = append(e.events, s)
	e.mu.Unlock()
}

func (e *sessionEvents) snapshot() (events []string, received, acked []uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.events...), append([]uint64(nil), e.received...), append([]uint64(nil), e.acked...)
}

type noApply struct{}

func (noApply) Apply(context.Context, *relaypb.OutputSet) ([]*relaypb.ObjectResult, error) {
	return []*relaypb.ObjectResult{{Outcome: "applied"}}, nil
}

// A replica that completes TLS but serves no session (here: no Relay
// service at all) is left after one failed session: each session dials one
// replica, the next session the next one, whatever the order of the list,
// and the hooks report the replica each session was open to, every set
// that arrived and every ack sent.
func TestSessionMovesToTheNextReplica(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true})
	c1 := f.Bootstrap("cluster-1")
	f.Outputs.Set("cluster-1", []*relaypb.OutputObject{{Manifest: []byte(`{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"a","namespace":"x"}}`)}})

	// The broken replica serves the same certificate on another port.
	serving, err := server.NewServingCert(context.Background(), f.Authority, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, nil, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	broken := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return serving.Certificate() }})))
	go func() { _ = broken.Serve(lis) }()
	t.Cleanup(broken.Stop)

	for _, tc := range []struct {
		name  string
		addrs []string
	}{
		{name: "broken first", addrs: []string{lis.Addr().String(), f.Addr}},
		{name: "broken last", addrs: []string{f.Addr, lis.Addr().String()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := &sessionEvents{}
			var dialMu sync.Mutex
			var dialed []string
			var d net.Dialer
			sess, err := agent.NewSession(agent.SessionConfig{
				ServerAddress: strings.Join(tc.addrs, ","), Version: "test",
				TLS: func() (*tls.Config, error) {
					c := f.MTLS(c1.TLS)
					c.ServerName = "localhost"
					return c, nil
				},
				Retry:        backoff.Policy{Min: 20 * time.Millisecond, Max: 50 * time.Millisecond},
				FirstReplica: func(n int) int { return 0 },
				Dialer: func(ctx context.Context, a string) (net.Conn, error) {
					dialMu.Lock()
					dialed = append(dialed, a)
					dialMu.Unlock()
					return d.DialContext(ctx, "tcp", a)
				},
				Applier: noApply{},
				Hooks: agent.SessionHooks{
					Opened: func(a string, conn grpc.ClientConnInterface, w *relaypb.Welcome) {
						assert.NotNil(t, conn)
						ev.add("opened " + a + " " + w.GetCluster())
					},
					Ended: func(a string, err error) {
						if !errors.Is(err, context.Canceled) {
							ev.add("ended " + a + " " + status.Code(err).String())
						}
					},
					Received: func(set *relaypb.OutputSet) {
						ev.mu.Lock()
						ev.received = append(ev.received, set.GetVersion())
						ev.mu.Unlock()
					},
					Acked: func(v uint64, results []*relaypb.ObjectResult) {
						assert.Len(t, results, 1)
						ev.mu.Lock()
						ev.acked = append(ev.acked, v)
						ev.mu.Unlock()
					},
				},
			})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = sess.Run(ctx) }()
			defer func() { cancel(); <-done }()

			require.Eventually(t, func() bool {
				_, _, acked := ev.snapshot()
				return sess.State().Connected && len(acked) > 0
			}, 20*time.Second, 10*time.Millisecond)
			events, received, acked := ev.snapshot()
			want := []string{"opened " + f.Addr + " cluster-1"}
			if tc.addrs[0] != f.Addr {
				want = append([]string{"ended  " + codes.Unimplemented.String()}, want...)
			}
			assert.Equal(t, want, events, "one failed session at the broken replica at most, then the one that serves")
			assert.Equal(t, f.Addr, sess.State().Server)
			assert.Equal(t, received[:1], acked[:1], "the set that arrived was acked")
			assert.Equal(t, f.Outputs.Version("cluster-1"), acked[0])
			dialMu.Lock()
			// One replica per session, through the configured dialer.
			if tc.addrs[0] == f.Addr {
				assert.Equal(t, []string{f.Addr}, dialed)
			} else {
				assert.Equal(t, tc.addrs, dialed)
			}
			dialMu.Unlock()
		})
	}
}
