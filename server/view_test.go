package server_test

import (
	"context"
	"testing"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/servertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The view tells listeners about every ack and keeps the last one; the
// outputs report each cluster's current version. Translation builds the
// per-cluster apply status of user objects from the two.
func TestAcksAndVersions(t *testing.T) {
	v := server.NewView()
	var acked []string
	v.OnAck(func(cluster string) { acked = append(acked, cluster) })
	assert.Nil(t, v.Ack("c1"))

	ack := &relaypb.PullAck{Version: 7, Results: []*relaypb.ObjectResult{{Kind: "VirtualService", Namespace: "ns", Name: "vs", Outcome: "conflict"}}}
	v.Acked("c1", ack, time.Now())
	assert.Equal(t, []string{"c1"}, acked)
	require.NotNil(t, v.Ack("c1"))
	assert.Equal(t, uint64(7), v.Ack("c1").GetVersion())
	assert.Len(t, v.Clusters()["c1"].Conflicts, 1)

	o := server.NewOutputs(time.Now())
	assert.Zero(t, o.Version("c1"), "no set yet")
	o.SetFrom("translation", "c1", []*relaypb.OutputObject{{Manifest: []byte(`{"kind":"VirtualService"}`)}})
	first := o.Version("c1")
	assert.NotZero(t, first)
	o.SetFrom("translation", "c1", []*relaypb.OutputObject{{Manifest: []byte(`{"kind":"VirtualService"}`)}})
	assert.Equal(t, first, o.Version("c1"), "an unchanged set keeps its version")
	o.SetFrom("translation", "c1", nil)
	assert.Greater(t, o.Version("c1"), first)
}

// TrustVersion is the version in which a cluster's current trust requests
// were first published: later object changes do not move it, a change of
// the trust requests does (an ack at or after it proves the agent holds
// them).
func TestTrustVersion(t *testing.T) {
	o := server.NewOutputs(time.Now())
	assert.Zero(t, o.TrustVersion("c1"), "nothing published")
	req := &relaypb.TrustRequest{Mesh: "m", Namespace: "istio-system", Issuer: "aa", RootBundle: []byte("pem")}
	o.SetTrust("c1", []*relaypb.TrustRequest{req})
	since := o.TrustVersion("c1")
	assert.Equal(t, o.Version("c1"), since)
	o.SetFrom("translation", "c1", []*relaypb.OutputObject{{Manifest: []byte(`{"kind":"VirtualService"}`)}})
	assert.Greater(t, o.Version("c1"), since)
	assert.Equal(t, since, o.TrustVersion("c1"), "an object change is no trust change")
	o.SetTrust("c1", []*relaypb.TrustRequest{req})
	assert.Equal(t, since, o.TrustVersion("c1"), "the same requests again")
	o.SetTrust("c1", []*relaypb.TrustRequest{{Mesh: "m", Namespace: "istio-system", Hold: true}})
	assert.Greater(t, o.TrustVersion("c1"), since, "a hold is a trust change")
	assert.Equal(t, o.Version("c1"), o.TrustVersion("c1"))
	o.Remove("c1")
	assert.Zero(t, o.TrustVersion("c1"))
}

// signerFunc adapts a function to server.IntermediateSigner.
type signerFunc func(ctx context.Context, cluster string, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error)

func (f signerFunc) SignIntermediate(ctx context.Context, cluster string, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
	return f(ctx, cluster, req)
}

// Trust.SignIntermediate is for authenticated agents only, and the cluster
// it signs for is the one the client certificate names, never a field of
// the request.
func TestSignIntermediateNeedsAnAgentCertificate(t *testing.T) {
	var clusters []string
	f := servertest.New(t, servertest.Options{Trust: signerFunc(func(_ context.Context, cluster string, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
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
