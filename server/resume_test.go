package server_test

import (
	"context"
	"testing"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server/servertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// An agent that failed over from a replica whose versions are higher says
// what it holds; this replica then sends the same set with a version above
// it, and every later set is higher still. A held version no replica can
// have made is refused and changes nothing.
func TestPullResumesAboveTheHeldVersion(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true})
	c1 := f.Bootstrap("cluster-1")
	obj := []*relaypb.OutputObject{{Manifest: []byte(`{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"a","namespace":"x"}}`)}}
	f.Outputs.Set("cluster-1", obj)
	pull := func() relaypb.Discovery_PullClient {
		stream, err := relaypb.NewDiscoveryClient(f.Dial(f.MTLS(c1.TLS))).Pull(context.Background())
		require.NoError(t, err)
		return stream
	}
	stream := pull()
	first, err := stream.Recv()
	require.NoError(t, err)

	held := first.GetVersion() + 1_000_000 // another replica's, started later
	require.NoError(t, stream.Send(&relaypb.PullAck{Version: held, Resume: true}))
	again, err := stream.Recv()
	require.NoError(t, err)
	assert.Greater(t, again.GetVersion(), held)
	assert.Equal(t, first.GetObjects()[0].GetManifest(), again.GetObjects()[0].GetManifest(), "the same set, a higher version")

	f.Outputs.Set("cluster-1", nil)
	next, err := stream.Recv()
	require.NoError(t, err)
	assert.Greater(t, next.GetVersion(), again.GetVersion())

	// A resume ack at the version already sent does not make another set.
	require.NoError(t, stream.Send(&relaypb.PullAck{Version: next.GetVersion() - 1, Resume: true}))
	f.Outputs.Set("cluster-1", obj)
	last, err := stream.Recv()
	require.NoError(t, err)
	assert.Equal(t, next.GetVersion()+1, last.GetVersion())

	for name, ack := range map[string]*relaypb.PullAck{
		"ahead of every replica": {Version: uint64(time.Now().UnixNano()) + 1<<43, Resume: true},
		"the counter's end":      {Version: ^uint64(0), Resume: true},
		"with results":           {Version: 1, Resume: true, Results: []*relaypb.ObjectResult{{Kind: "Secret", Outcome: "applied"}}},
	} {
		before := f.Outputs.Version("cluster-1")
		s := pull()
		_, err := s.Recv()
		require.NoError(t, err)
		require.NoError(t, s.Send(ack))
		_, err = s.Recv()
		assert.Equal(t, codes.InvalidArgument, status.Code(err), name)
		assert.Equal(t, before, f.Outputs.Version("cluster-1"), "%s: nothing changed", name)
	}
}
