package fleet

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
)

// FleetConfig describes a fleet of simulated agents.
type FleetConfig struct {
	// Servers are the relay addresses; agent i starts with Servers[i % len].
	Servers []string
	// ServerName, if set, is the name every server certificate must carry.
	ServerName string
	// Roots are the pinned relay roots.
	Roots *x509.CertPool
	// Members are the clusters, one agent each.
	Members []Member
	// Snapshot gives each cluster's snapshot (nil: no Push stream).
	Snapshot func(cluster string) *relaypb.Snapshot
	// SourceOffset shifts the agents' source addresses (SourceAddr(offset+i)),
	// so two fleets in one process never share one.
	SourceOffset int
	// Agent is the template for every agent's remaining settings (timings,
	// hooks, KeepOutputs); its Cluster, Token, Source, Servers, Roots and
	// Snapshot are ignored.
	Agent AgentConfig
}

// Fleet is a set of agents started together.
type Fleet struct {
	agents    []*Agent
	byCluster map[string]*Agent
	started   time.Time
}

// NewFleet builds every agent (and its snapshot) without starting any.
func NewFleet(cfg FleetConfig) (*Fleet, error) {
	if len(cfg.Members) == 0 {
		return nil, errors.New("fleet: no members")
	}
	f := &Fleet{byCluster: map[string]*Agent{}}
	for i, m := range cfg.Members {
		ac := cfg.Agent
		ac.Cluster, ac.Token = m.Cluster, m.Token
		ac.Source = SourceAddr(cfg.SourceOffset + i)
		ac.Servers, ac.FirstServer, ac.ServerName, ac.Roots = cfg.Servers, i, cfg.ServerName, cfg.Roots
		ac.Snapshot = nil
		if cfg.Snapshot != nil {
			ac.Snapshot = cfg.Snapshot(m.Cluster)
		}
		a, err := NewAgent(ac)
		if err != nil {
			return nil, fmt.Errorf("fleet member %d: %w", i, err)
		}
		if f.byCluster[m.Cluster] != nil {
			return nil, fmt.Errorf("fleet member %d: cluster %s is listed twice", i, m.Cluster)
		}
		f.agents = append(f.agents, a)
		f.byCluster[m.Cluster] = a
	}
	return f, nil
}

// Start starts every agent at once (a bootstrap storm) and returns when all
// goroutines run; it returns the start time.
func (f *Fleet) Start(ctx context.Context) time.Time {
	f.started = time.Now()
	for _, a := range f.agents {
		a.Start(ctx)
	}
	return f.started
}

// StartPaced starts perSecond agents a second (a fleet coming up over
// time rather than at once) and returns when every agent was started, or
// ctx ended.
func (f *Fleet) StartPaced(ctx context.Context, perSecond float64) time.Time {
	f.started = time.Now()
	gap := time.Duration(float64(time.Second) / perSecond)
	for i, a := range f.agents {
		if i > 0 {
			select {
			case <-ctx.Done():
				return f.started
			case <-time.After(time.Until(f.started.Add(time.Duration(i) * gap))):
			}
		}
		a.Start(ctx)
	}
	return f.started
}

// Started is when Start was called.
func (f *Fleet) Started() time.Time { return f.started }

// Agents returns the agents in member order.
func (f *Fleet) Agents() []*Agent { return slices.Clone(f.agents) }

// Agent returns the agent of cluster, or nil.
func (f *Fleet) Agent(cluster string) *Agent { return f.byCluster[cluster] }

// States returns every agent's state in member order.
func (f *Fleet) States() []AgentState {
	out := make([]AgentState, len(f.agents))
	for i, a := range f.agents {
		out[i] = a.State()
	}
	return out
}

// Stop stops every agent and waits for them.
func (f *Fleet) Stop() {
	var wg sync.WaitGroup
	for _, a := range f.agents {
		wg.Add(1)
		go func() { defer wg.Done(); a.Stop() }()
	}
	wg.Wait()
}

// Wait polls until cond holds for every agent, or ctx ends; it then says how
// many did not get there.
func (f *Fleet) Wait(ctx context.Context, what string, cond func(AgentState) bool) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		missing := 0
		var example AgentState
		for _, a := range f.agents {
			if st := a.State(); !cond(st) {
				if missing == 0 {
					example = st
				}
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fleet: %d of %d agents not %s (e.g. %s: last error %v): %w", missing, len(f.agents), what, example.Cluster, example.LastError, ctx.Err())
		case <-tick.C:
		}
	}
}

// Connected holds for an agent with an open session.
func Connected(st AgentState) bool { return st.Connected }

// Synced holds for an agent with an open session whose snapshot was
// accepted and that acknowledged an output set.
func Synced(st AgentState) bool {
	return st.Connected && !st.Timeline.Pushed.IsZero() && st.Acked != 0
}

// Summary describes a set of durations.
type Summary struct {
	N                       int
	Min, P50, P90, P99, Max time.Duration
	Mean                    time.Duration
}

// Summarize computes a Summary (nearest-rank percentiles).
func Summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return Summary{N: len(s), Min: s[0], P50: rank(0.50), P90: rank(0.90), P99: rank(0.99), Max: s[len(s)-1], Mean: sum / time.Duration(len(s))}
}

func (s Summary) String() string {
	r := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	return fmt.Sprintf("n=%d p50=%s p90=%s p99=%s max=%s (min %s, mean %s)", s.N, r(s.P50), r(s.P90), r(s.P99), r(s.Max), r(s.Min), r(s.Mean))
}
