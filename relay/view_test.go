package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The view tells listeners about every ack and keeps the last one; the
// outputs report each cluster's current version. Translation builds the
// per-cluster apply status of user objects from the two.
func TestAcksAndVersions(t *testing.T) {
	v := relay.NewView()
	var acked []string
	v.OnAck(func(cluster string) { acked = append(acked, cluster) })
	assert.Nil(t, v.Ack("c1"))

	ack := &relaypb.PullAck{Version: 7, Results: []*relaypb.ObjectResult{{Kind: "VirtualService", Namespace: "ns", Name: "vs", Outcome: "conflict"}}}
	v.Acked("c1", ack, time.Now())
	assert.Equal(t, []string{"c1"}, acked)
	require.NotNil(t, v.Ack("c1"))
	assert.Equal(t, uint64(7), v.Ack("c1").GetVersion())
	assert.Len(t, v.Clusters()["c1"].Conflicts, 1)

	o := relay.NewOutputs(time.Now())
	assert.Zero(t, o.Version("c1"), "no set yet")
	o.SetFrom("translation", "c1", []*relaypb.OutputObject{{Manifest: []byte(`{"kind":"VirtualService"}`)}})
	first := o.Version("c1")
	assert.NotZero(t, first)
	o.SetFrom("translation", "c1", []*relaypb.OutputObject{{Manifest: []byte(`{"kind":"VirtualService"}`)}})
	assert.Equal(t, first, o.Version("c1"), "an unchanged set keeps its version")
	o.SetFrom("translation", "c1", nil)
	assert.Greater(t, o.Version("c1"), first)
}

// signerFunc adapts a function to relay.IntermediateSigner.
type signerFunc func(ctx context.Context, cluster string, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error)

func (f signerFunc) SignIntermediate(ctx context.Context, cluster string, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
	return f(ctx, cluster, req)
}

// Trust.SignIntermediate is for authenticated agents only, and the cluster
// it signs for is the one the client certificate names, never a field of
// the request.
func TestSignIntermediateNeedsAnAgentCertificate(t *testing.T) {
	var clusters []string
	f := relaytest.New(t, relaytest.Options{Trust: signerFunc(func(_ context.Context, cluster string, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
		clusters = append(clusters, cluster+"/"+req.GetMesh())
		return &relaypb.IntermediateResponse{Issuer: "x"}, nil
	})})
	ctx := context.Background()
	c1 := f.Bootstrap("cluster-1")
	resp, err := relaypb.NewTrustClient(f.Dial(f.MTLS(c1.TLS))).SignIntermediate(ctx, &relaypb.IntermediateRequest{Mesh: "istiod-cluster-2"})
	require.NoError(t, err)
	assert.Equal(t, "x", resp.GetIssuer())
	assert.Equal(t, []string{"cluster-1/istiod-cluster-2"}, clusters, "the caller's cluster comes from its certificate")

	_, err = relaypb.NewTrustClient(f.Dial(f.ServerOnly())).SignIntermediate(ctx, &relaypb.IntermediateRequest{Mesh: "istiod-cluster-1"})
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	assert.Len(t, clusters, 1, "an unauthenticated call never reaches the signer")
}
