package server

import (
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
)

// maxClockOffset bounds the agent clock offsets the server records: a
// Hello whose time is further off than this is nonsense, not a clock.
const maxClockOffset = 365 * 24 * time.Hour

// ClockSink is an optional capability of a StatusSink: it hears how far an
// agent's clock is from the server's when a session opens. It MUST NOT
// block for long.
type ClockSink interface {
	AgentClock(cluster string, offset time.Duration)
}

// agentClock passes the offset of the agent's clock at Hello to the status
// sink, when the agent reported its time and the sink records it.
func (s *Server) agentClock(cluster string, hello *relaypb.Hello) {
	sink, ok := s.cfg.Status.(ClockSink)
	if !ok || hello.GetAgentTimeUnixNano() == 0 {
		return
	}
	offset := time.Unix(0, hello.GetAgentTimeUnixNano()).Sub(s.cfg.Clock())
	if offset > maxClockOffset || offset < -maxClockOffset {
		return
	}
	sink.AgentClock(cluster, offset)
}

// AgentClock implements ClockSink: status.agentClockOffset, to the
// millisecond.
func (k *KubeStatus) AgentClock(cluster string, offset time.Duration) {
	offset = offset.Round(time.Millisecond)
	k.mark(cluster, func(st *agentState) { st.clockOffset = &offset })
}
