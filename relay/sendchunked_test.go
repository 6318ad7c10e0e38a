package relay_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/relay/snapshothash"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// capture is a PushChunked stream that keeps what is sent, and fails the
// send after failAfter messages when failAfter > 0.
type capture struct {
	msgs      []*relaypb.SnapshotChunk
	failAfter int
}

var errSend = errors.New("stream broken")

func (c *capture) Send(m *relaypb.SnapshotChunk) error {
	if c.failAfter > 0 && len(c.msgs) == c.failAfter {
		return errSend
	}
	c.msgs = append(c.msgs, m)
	return nil
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// TestSendChunkedFramingIsUnchanged: the framing of relaytest.Golden(4000)
// (three parts) is the one the agent's encoder sent before it moved into
// relay (recorded at 7305c91): header, each part's size and SHA-256, end.
func TestSendChunkedFramingIsUnchanged(t *testing.T) {
	const hash = "31d2495827e53c64989528d0b73e77e42ea52032aa699ecc94a268412f8a17ae"
	s := relaytest.Rehash(relaytest.Golden(4000))
	require.Equal(t, hash, s.Hash)
	c := &capture{}
	sent, err := relay.SendChunked(c, s, relay.DefaultMaxChunkedSnapshotBytes)
	require.NoError(t, err)
	assert.Equal(t, relay.SentSnapshot{Hash: hash, Sum: hash, Size: 2366346, Parts: 3}, sent)
	require.Len(t, c.msgs, 5)
	assert.True(t, proto.Equal(&relaypb.SnapshotHeader{Cluster: "cluster-golden", Hash: hash, Size: 2366346, Parts: 3}, c.msgs[0].GetHeader()))
	want := []struct {
		size int
		sha  string
	}{
		{1048576, "ecbf4b53e5b11d92d1cdad80735370c4c2e3c334a81556d25e42666c0ee846e2"},
		{1048576, "fbd8bd3e7d4600a39b1d56e8e35451a768d272fffa714c435e5ccf8669afaf7a"},
		{269194, "b7691fa46f3ce100dfff692c3e679e228f528f2b0ae5ec70d7fd7279fa485ed3"},
	}
	for i, w := range want {
		p := c.msgs[1+i].GetPart()
		require.NotNil(t, p, "message %d is a part", 1+i)
		assert.Equal(t, uint32(i), p.GetIndex())
		assert.Len(t, p.GetData(), w.size)
		assert.Equal(t, w.sha, sha(p.GetData()), "part %d", i)
	}
	assert.Equal(t, hash, c.msgs[4].GetEnd().GetHash())
}

// TestSendChunkedRoundTripsThroughAssembler: what the encoder sends, the
// decoder assembles into the snapshot sent, with its hash, and it passes
// ValidateAssembled.
func TestSendChunkedRoundTripsThroughAssembler(t *testing.T) {
	for _, n := range []int{0, 1, 3000} {
		s := relaytest.Snapshot(n)
		c := &capture{}
		sent, err := relay.SendChunked(c, s, relay.DefaultMaxChunkedSnapshotBytes)
		require.NoError(t, err)
		require.Equal(t, s.GetHash(), sent.Hash)
		a := relay.NewAssembler(relay.AssemblerConfig{Cluster: "cluster-1", Deadline: time.Minute, Now: time.Now,
			Budget: relay.NewSnapshotBudget(256<<20, prometheus.NewGauge(prometheus.GaugeOpts{Name: "test"}))})
		var out *relay.Assembled
		for _, m := range c.msgs {
			out, err = a.Add(m)
			require.NoError(t, err)
		}
		require.NotNil(t, out, "%d destinations", n)
		require.NoError(t, out.Err)
		assert.True(t, proto.Equal(s, out.Snapshot), "%d destinations", n)
		assert.Equal(t, sent.Size, out.Size)
		assert.NoError(t, relay.ValidateAssembled("cluster-1", out.Snapshot, relay.SnapshotLimits{}, out.Hash))
		a.Close()
	}
}

// TestSendChunkedHashesASnapshotWithoutHash: a snapshot whose hash field
// is not a hash is hashed first; one whose hash field is a wrong hash is
// sent under it, and Sum tells the caller it is wrong.
func TestSendChunkedHashesASnapshotWithoutHash(t *testing.T) {
	s := relaytest.Golden(0)
	s.Hash = ""
	sent, err := relay.SendChunked(&capture{}, s, relay.DefaultMaxChunkedSnapshotBytes)
	require.NoError(t, err)
	assert.Equal(t, snapshothash.Of(s), sent.Hash)
	assert.Equal(t, sent.Hash, sent.Sum)

	wrong := relaytest.Snapshot(2)
	wrong.Hash = snapshothash.Of(relaytest.Snapshot(3))
	c := &capture{}
	sent, err = relay.SendChunked(c, wrong, relay.DefaultMaxChunkedSnapshotBytes)
	require.NoError(t, err)
	assert.Equal(t, wrong.Hash, sent.Hash, "the header names the hash the snapshot carries")
	assert.Equal(t, snapshothash.Of(wrong), sent.Sum)
	assert.NotEqual(t, sent.Hash, sent.Sum)
}

// TestSendChunkedRefuses: a snapshot over the limit sends nothing; one
// that does not encode sends nothing; a broken stream's error comes back.
func TestSendChunkedRefuses(t *testing.T) {
	s := relaytest.Snapshot(50)
	c := &capture{}
	_, err := relay.SendChunked(c, s, proto.Size(s)-100)
	require.ErrorIs(t, err, relay.ErrSnapshotTooLarge)
	assert.Empty(t, c.msgs, "nothing is sent")

	bad := &relaypb.Snapshot{Cluster: "bad\xff"}
	_, err = relay.SendChunked(c, bad, relay.DefaultMaxChunkedSnapshotBytes)
	require.Error(t, err)
	assert.Empty(t, c.msgs)

	big := relaytest.Golden(4000)
	for _, after := range []int{1, 2, 3} {
		c := &capture{failAfter: after}
		_, err := relay.SendChunked(c, big, relay.DefaultMaxChunkedSnapshotBytes)
		assert.ErrorIs(t, err, errSend, "failing after %d messages", after)
	}
}
