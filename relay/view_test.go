package relay_test

import (
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
