package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/relay"
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

func cpuTime(t testing.TB) time.Duration {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// 200 concurrent Bootstrap calls of 4 MiB from one address without a
// certificate: each is refused on its 5-byte length prefix, before its body
// is read or decoded, so the server's memory does not grow with them; and
// each costs the address a failure, so the address is throttled after its
// budget.
func TestPreAuthOversizedCallsAreRefusedUnread(t *testing.T) {
	f := servertest.New(t, servertest.Options{FailureBurst: 500})
	const calls = 200
	chunk := make([]byte, 16<<10)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var conns []*servertest.RawConn
	var ids [][]uint32
	var peak uint64
	for range calls / 2 { // two streams per connection (MaxConcurrentStreams 2)
		r, err := servertest.DialRaw(t, f.Addr, f.ServerOnly(), "")
		require.NoError(t, err)
		var mine []uint32
		for range 2 {
			id, err := r.Headers("/relaymesh.relay.v1.Identity/Bootstrap", false)
			require.NoError(t, err)
			require.NoError(t, r.Data(id, servertest.GRPCHeader(4<<20), false))
			// As much of the body as the connection's flow-control window
			// lets two streams send.
			_ = r.Data(id, chunk, false)
			mine = append(mine, id)
		}
		conns, ids = append(conns, r), append(ids, mine)
	}
	refused := 0
	deadline := time.Now().Add(10 * time.Second)
	for i, r := range conns {
		for _, id := range ids[i] {
			for r.Status(id) == "" && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if r.Status(id) == fmt.Sprint(int(codes.ResourceExhausted)) {
				refused++
			}
		}
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	peak = after.HeapInuse
	grew := int64(peak) - int64(before.HeapInuse)
	t.Logf("%d concurrent 4 MiB pre-auth calls: %d refused (ResourceExhausted); heap in use %d MiB -> %d MiB", calls, refused, before.HeapInuse>>20, peak>>20)
	assert.Equal(t, calls, refused, "every oversized call is refused")
	assert.Less(t, grew, int64(64<<20), "the server did not buffer the messages (heap grew %d MiB)", grew>>20)
	assert.Equal(t, float64(calls), f.Metric(server.MetricRefusedCalls, "reason", "preauth_resourceexhausted"), "each refusal is counted")

	// They cost the address its failure budget like any failed call.
	small := servertest.New(t, servertest.Options{FailureBurst: 3})
	for range 3 {
		r, err := servertest.DialRaw(t, small.Addr, small.ServerOnly(), "")
		require.NoError(t, err)
		id, err := r.Headers("/relaymesh.relay.v1.Identity/Bootstrap", false)
		require.NoError(t, err)
		require.NoError(t, r.Data(id, servertest.GRPCHeader(4<<20), false))
		require.Eventually(t, func() bool { return r.Status(id) != "" }, 5*time.Second, 5*time.Millisecond)
	}
	_, err := small.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: small.Mint("cluster-1", time.Hour)})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "the address spent its budget on oversized calls: %v", err)
}

// HTTP/2 rapid reset (HEADERS then RST_STREAM, as fast as the client can):
// an unauthenticated connection is cut after PreAuthStreams streams, an
// authenticated one after its stream burst; the CPU the flood costs the
// server is bounded by the TLS handshakes of reconnecting.
func TestRapidResetIsCutOff(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	flood := func(cfg *tls.Config) (sent int, cut bool) {
		r, err := servertest.DialRaw(t, f.Addr, cfg, "")
		require.NoError(t, err)
		for sent = 0; sent < 100000; sent++ {
			id, err := r.Headers("/relaymesh.relay.v1.Identity/Bootstrap", false)
			if err == nil {
				err = r.Reset(id)
			}
			if err != nil {
				break
			}
			select {
			case <-r.Closed():
				return sent, true
			default:
			}
		}
		return sent, r.IsClosed(2 * time.Second)
	}
	sent, cut := flood(f.ServerOnly())
	assert.True(t, cut, "the unauthenticated connection is closed")
	t.Logf("unauthenticated: cut off after sending %d HEADERS+RST_STREAM", sent)
	assert.Less(t, sent, 2000, "cut off promptly (PreAuthStreams is 8; frames already in flight count too)")

	cred := f.Bootstrap("cluster-1")
	sent, cut = flood(f.MTLS(cred.TLS))
	assert.True(t, cut, "the authenticated connection is closed too")
	t.Logf("authenticated: cut off after sending %d HEADERS+RST_STREAM", sent)
	assert.Less(t, sent, 20000)
	assert.Positive(t, f.Metric(server.MetricConnsRefused, "reason", "preauth_stream_budget"))
	assert.Positive(t, f.Metric(server.MetricConnsRefused, "reason", "authenticated_stream_budget"))

	// A 3-second flood that reconnects every time it is cut: after three
	// cuts the address's new connections are closed before the handshake.
	start, cpu0 := time.Now(), cpuTime(t)
	var total, cuts, refused int
	for time.Since(start) < 3*time.Second {
		r, err := servertest.DialRaw(t, f.Addr, f.ServerOnly(), "")
		if err != nil {
			refused++
			continue
		}
		_ = r.Close()
		n, c := flood(f.ServerOnly())
		total += n
		if c {
			cuts++
		}
	}
	cpu := cpuTime(t) - cpu0
	t.Logf("3 s rapid-reset flood with reconnects: %d streams on %d connections cut, %d connections refused before the handshake; test process CPU %.2f cores (client and server together)",
		total, cuts, refused, cpu.Seconds()/time.Since(start).Seconds())
	assert.Less(t, total, 2000, "the abusive address gets no more streams")
	assert.Positive(t, f.Metric(server.MetricConnsRefused, "reason", "abuse"))

	// The server still serves everyone else: a bootstrap from another
	// address succeeds.
	conn, err := grpc.NewClient(f.Addr, grpc.WithTransportCredentials(credentials.NewTLS(f.ServerOnly())),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}}
			return d.DialContext(ctx, "tcp", addr)
		}))
	require.NoError(t, err)
	defer conn.Close()
	csr, _ := servertest.CSRPEM(t)
	_, err = relaypb.NewIdentityClient(conn).Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-2", Token: f.Mint("cluster-2", time.Hour), Csr: csr})
	require.NoError(t, err)
}

// A peer that connects and never completes the TLS handshake is
// disconnected at the handshake deadline; an unauthenticated connection
// that stays idle is closed too.
func TestHandshakeDeadlineAndIdlePreAuth(t *testing.T) {
	f := servertest.New(t, servertest.Options{Connections: relay.ConnectionLimits{HandshakeTimeout: 300 * time.Millisecond, PreAuthIdle: 500 * time.Millisecond}})
	c, err := net.Dial("tcp", f.Addr)
	require.NoError(t, err)
	defer c.Close()
	start := time.Now()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = c.Read(make([]byte, 1))
	require.Error(t, err)
	assert.False(t, isTimeout(err), "the server closed the silent connection")
	assert.Less(t, time.Since(start), 2*time.Second)
	t.Logf("a silent connection was closed after %s", time.Since(start).Round(time.Millisecond))

	r, err := servertest.DialRaw(t, f.Addr, f.ServerOnly(), "")
	require.NoError(t, err)
	assert.True(t, r.IsClosed(5*time.Second), "an idle unauthenticated connection is closed")
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Connections are capped per address before the handshake: the one over
// the cap is closed at once; closing one makes room.
func TestConnectionCapsPerAddress(t *testing.T) {
	f := servertest.New(t, servertest.Options{Connections: relay.ConnectionLimits{MaxPreAuthPerAddress: 4}})
	var open []net.Conn
	for range 4 {
		c, err := net.Dial("tcp", f.Addr)
		require.NoError(t, err)
		open = append(open, c)
	}
	require.Eventually(t, func() bool { return f.Metric(server.MetricOpenConns, "state", "preauth") == 4 },
		10*time.Second, 5*time.Millisecond, "the gate counted the four")
	over, err := net.Dial("tcp", f.Addr)
	require.NoError(t, err)
	require.NoError(t, over.SetReadDeadline(time.Now().Add(3*time.Second)))
	_, err = over.Read(make([]byte, 1))
	require.Error(t, err)
	assert.ErrorIs(t, err, io.EOF, "the fifth connection is closed at once")
	assert.Equal(t, 1.0, f.Metric(server.MetricConnsRefused, "reason", "address_preauth_limit"))
	_ = open[0].Close()
	require.Eventually(t, func() bool {
		_, err := relaypb.NewIdentityClient(f.Dial(f.ServerOnly())).Bootstrap(context.Background(), &relaypb.BootstrapRequest{})
		return status.Code(err) == codes.InvalidArgument
	}, 5*time.Second, 50*time.Millisecond, "a freed place takes a new connection")
	for _, c := range open[1:] {
		_ = c.Close()
	}
}

// Bad tokens from many addresses: each address is within its own budget,
// but all of them share one; past it they are refused without evaluation,
// and summarised in the audit log instead of one record each.
func TestGlobalBootstrapFailureBudget(t *testing.T) {
	// The global budget refills once an hour here, so the count is exact.
	f := servertest.New(t, servertest.Options{FailureBurst: 5, GlobalFailureBurst: 20, GlobalFailuresPerMinute: 1.0 / 60})
	codesSeen := map[codes.Code]int{}
	for i := range 200 {
		local := fmt.Sprintf("127.0.%d.%d", 1+i/250, 1+i%250)
		conn, err := grpc.NewClient(f.Addr, grpc.WithTransportCredentials(credentials.NewTLS(f.ServerOnly())),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
				return d.DialContext(ctx, "tcp", addr)
			}))
		require.NoError(t, err)
		csr, _ := servertest.CSRPEM(t)
		_, err = relaypb.NewIdentityClient(conn).Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: "rmt_" + strings.Repeat("x", 60), Csr: csr})
		codesSeen[status.Code(err)]++
		_ = conn.Close()
	}
	t.Logf("200 bad bootstraps from 200 addresses: %v", codesSeen)
	assert.Equal(t, 20, codesSeen[codes.PermissionDenied], "the global budget: 20 evaluated")
	assert.Equal(t, 180, codesSeen[codes.ResourceExhausted])
	f.Srv.Stop() // flushes the summary
	b, err := os.ReadFile(f.AuditPath)
	require.NoError(t, err)
	_, err = audit.Verify(bytes.NewReader(b))
	require.NoError(t, err)
	failures, summaries := 0, 0
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var r audit.Record
		require.NoError(t, json.Unmarshal(line, &r))
		switch r.Type {
		case audit.TokenFailure:
			failures++
		case audit.Throttled:
			summaries++
			assert.Equal(t, "180", r.Details["count"])
			assert.Equal(t, "180", r.Details["peers"])
		}
	}
	assert.Equal(t, 20, failures, "only evaluated failures are audited one by one")
	assert.Equal(t, 1, summaries, "the rest in one summary")
}

// Per-cluster budgets: renewals, open streams, refused intermediate
// requests (which no longer reach the signer once spent).
func TestPerClusterLimits(t *testing.T) {
	var signed atomic.Int32
	signer := signerFunc(func(context.Context, string, *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
		signed.Add(1)
		return nil, status.Error(codes.PermissionDenied, "not your mesh")
	})
	f := servertest.New(t, servertest.Options{DataPath: true, Trust: signer,
		Clusters: relay.ClusterLimits{RenewBurst: 3, RenewsPerMinute: 1, MaxSessions: 3, RefusalBurst: 3, RefusalsPerMinute: 1}})
	ctx := context.Background()
	cred := f.Bootstrap("cluster-1")
	conn := f.Dial(f.MTLS(cred.TLS))

	var renewCodes []codes.Code
	for range 5 {
		csr, _ := servertest.CSRPEM(t)
		_, err := relaypb.NewIdentityClient(conn).Renew(ctx, &relaypb.RenewRequest{Csr: csr})
		renewCodes = append(renewCodes, status.Code(err))
	}
	assert.Equal(t, []codes.Code{codes.OK, codes.OK, codes.OK, codes.ResourceExhausted, codes.ResourceExhausted}, renewCodes)

	var sessions []relaypb.Relay_ConnectClient
	for range 3 {
		s, err := relaypb.NewRelayClient(conn).Connect(ctx)
		require.NoError(t, err)
		require.NoError(t, s.Send(&relaypb.AgentMessage{Msg: &relaypb.AgentMessage_Hello{Hello: &relaypb.Hello{}}}))
		_, err = s.Recv()
		require.NoError(t, err)
		sessions = append(sessions, s)
	}
	s, err := relaypb.NewRelayClient(conn).Connect(ctx)
	require.NoError(t, err)
	_, err = s.Recv()
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "a fourth stream of the cluster")
	_ = sessions

	var trustCodes []codes.Code
	for range 6 {
		_, err := relaypb.NewTrustClient(conn).SignIntermediate(ctx, &relaypb.IntermediateRequest{Mesh: "someone-elses"})
		trustCodes = append(trustCodes, status.Code(err))
	}
	assert.Equal(t, []codes.Code{codes.PermissionDenied, codes.PermissionDenied, codes.PermissionDenied, codes.ResourceExhausted, codes.ResourceExhausted, codes.ResourceExhausted}, trustCodes)
	assert.Equal(t, int32(3), signed.Load(), "refusals past the budget never reach the signer")
	// Another cluster has its own budgets.
	other := f.Bootstrap("cluster-2")
	csr, _ := servertest.CSRPEM(t)
	_, err = relaypb.NewIdentityClient(f.Dial(f.MTLS(other.TLS))).Renew(ctx, &relaypb.RenewRequest{Csr: csr})
	assert.NoError(t, err)
}
