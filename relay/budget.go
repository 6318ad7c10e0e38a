package relay

// ClusterLimits bound what one registered cluster may ask for, whatever its
// agent does: its certificate identifies it, so these are per cluster, not
// per address.
type ClusterLimits struct {
	// RenewsPerMinute and RenewBurst bound certificate renewals; defaults
	// 6/min, burst 10 (an agent renews once a day; replicas and restarts
	// add a few).
	RenewsPerMinute float64
	RenewBurst      int
	// MaxSessions is how many streams (sessions, snapshot and output
	// streams) a cluster may hold open at once; default 32.
	MaxSessions int
	// RefusalsPerMinute and RefusalBurst bound the refused requests of a
	// cluster (intermediates it may not have, calls of a stale
	// certificate) that are evaluated and audited one by one; beyond them
	// they are refused at once and summarised. Defaults 6/min, burst 10.
	RefusalsPerMinute float64
	RefusalBurst      int
}

// WithDefaults fills the zero fields of l with their defaults.
func (l ClusterLimits) WithDefaults() ClusterLimits {
	if l.RenewsPerMinute == 0 {
		l.RenewsPerMinute = 6
	}
	if l.RenewBurst == 0 {
		l.RenewBurst = 10
	}
	if l.MaxSessions == 0 {
		l.MaxSessions = 32
	}
	if l.RefusalsPerMinute == 0 {
		l.RefusalsPerMinute = 6
	}
	if l.RefusalBurst == 0 {
		l.RefusalBurst = 10
	}
	return l
}
