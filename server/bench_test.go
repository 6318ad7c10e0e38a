package server_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server/servertest"
)

// BenchmarkBootstrap measures a full agent bootstrap as an agent sees it: a
// new TLS 1.3 connection pinned to the relay root, token redemption (in
// memory) and issuance, on loopback. Minting and CSR generation happen
// outside the timer.
func BenchmarkBootstrap(b *testing.B) {
	srv := servertest.New(b, servertest.Options{})
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		tok := srv.Mint("cluster-1", time.Hour)
		csr, _ := servertest.CSRPEM(b)
		b.StartTimer()
		conn, err := srv.NewConn(srv.ServerOnly())
		if err != nil {
			b.Fatal(err)
		}
		_, err = relaypb.NewIdentityClient(conn).Bootstrap(ctx, &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: tok, Csr: csr})
		conn.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "bootstraps/s")
}

// BenchmarkRenew is Identity.Renew as a renewing agent sends it: one mTLS
// connection per cluster (two clusters), distinct P-256 requests, parallel
// callers; the audit log is synced as the server's is. The budgets that
// would measure themselves instead of issuance are lifted.
func BenchmarkRenew(b *testing.B) {
	srv := servertest.New(b, servertest.Options{
		Clusters:    relay.ClusterLimits{RenewsPerMinute: 1e9, RenewBurst: 1 << 30},
		Connections: relay.ConnectionLimits{StreamsPerSecond: 1e9, StreamBurst: 1 << 30},
	})
	var clients []relaypb.IdentityClient
	for _, c := range []string{"cluster-1", "cluster-2"} {
		cred := srv.Bootstrap(c)
		clients = append(clients, relaypb.NewIdentityClient(srv.Dial(srv.MTLS(cred.TLS))))
	}
	csrs := make([][]byte, 512)
	for i := range csrs {
		csrs[i], _ = servertest.CSRPEM(b)
	}
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := int(next.Add(1))
			if _, err := clients[i%len(clients)].Renew(ctx, &relaypb.RenewRequest{Csr: csrs[i%len(csrs)]}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "certs/s")
}
