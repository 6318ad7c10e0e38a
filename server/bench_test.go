package server_test

import (
	"context"
	"testing"
	"time"

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
