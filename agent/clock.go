package agent

import "time"

// now is the agent's clock.
func (s *Session) now() time.Time {
	if s.cfg.Clock != nil {
		return s.cfg.Clock()
	}
	return time.Now()
}
