package snapshots

import "github.com/prometheus/client_golang/prometheus"

// RequestsCounter exposes a store's request counter to the tests.
func RequestsCounter(s *Store) *prometheus.CounterVec { return s.requests }
