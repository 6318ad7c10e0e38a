package server

import (
	"crypto/x509"
	"testing"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/stretchr/testify/assert"
)

type clockSink struct{ offsets map[string]time.Duration }

func (c *clockSink) CertificateIssued(string, *x509.Certificate, string) {}
func (c *clockSink) SessionChanged(string, bool)                         {}
func (c *clockSink) AgentClock(cluster string, offset time.Duration)     { c.offsets[cluster] = offset }

// The server records how far an agent's clock is from its own at Hello,
// and ignores agents that do not report it and times that are nonsense.
func TestAgentClock(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	sink := &clockSink{offsets: map[string]time.Duration{}}
	s := &Server{cfg: ServerConfig{Status: sink, Clock: func() time.Time { return now }}}
	for cluster, agentTime := range map[string]int64{
		"ahead":    now.Add(90 * time.Second).UnixNano(),
		"behind":   now.Add(-1500 * time.Millisecond).UnixNano(),
		"old":      0,
		"nonsense": now.Add(-2 * maxClockOffset).UnixNano(),
	} {
		s.agentClock(cluster, &relaypb.Hello{AgentVersion: "v", AgentTimeUnixNano: agentTime})
	}
	assert.Equal(t, map[string]time.Duration{"ahead": 90 * time.Second, "behind": -1500 * time.Millisecond}, sink.offsets)

	// A sink without the capability is left alone.
	s.cfg.Status = nil
	s.agentClock("ahead", &relaypb.Hello{AgentTimeUnixNano: now.UnixNano()})
}
