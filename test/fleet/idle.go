package fleet

import (
	"context"
	"errors"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
)

// IdleConfig measures what connected, idle agents cost the server.
type IdleConfig struct {
	Options
	// Agents is the fleet size. Required.
	Agents int
	// Snapshot each agent pushes; default one mesh, one Service, one pod.
	// NoSnapshot opens no Push stream: the cost of the session alone.
	Snapshot   SnapshotSpec
	NoSnapshot bool
	// Settle is how long the fleet idles, twice: once the server caught up
	// (the status and mirror writes that follow the fleet's start settle),
	// and again over the measured window, whose server CPU is the idle CPU
	// and at whose end the second sample is read; default 30s.
	Settle time.Duration
	// PerSecond paces the fleet's start (agents a second), so that the
	// bootstrap storm does not decide who connects; default 20.
	PerSecond float64
	// Policy, when set, is a request timeout a TrafficPolicy without
	// selectors applies, so every agent also holds an output set.
	Policy string
}

// ServerSample is the server's footprint at one moment.
type ServerSample struct {
	// RSS and Threads from /proc.
	RSS     int64
	Threads int
	// From /metrics: heap in use, heap allocated (live and not yet
	// collected), the next GC goal (about twice the heap that was live at
	// the last GC, plus GC roots), goroutine stacks, goroutines and open
	// descriptors.
	HeapInuse, HeapAlloc, NextGC, StackInuse, Goroutines, OpenFDs float64
}

// IdleResult is the footprint before and after the fleet connected, and
// the difference per agent.
type IdleResult struct {
	Agents int
	Hygiene
	Before, After ServerSample
	// PerAgent is (After - Before) / Agents; LiveHeap is NextGC/2; Stack
	// is the goroutines' stacks (part of the RSS, not of the heap).
	PerAgentRSS, PerAgentHeapInuse, PerAgentLiveHeap, PerAgentStack, PerAgentGoroutines float64
	// IdleCPU is the server's CPU per second of the settle window.
	IdleCPU float64
	// Connected agents when the second sample was taken.
	Connected int
	// Quiet is how long after the last session the server's catch-up
	// writes were done (every discovered object in the management cluster,
	// every KubernetesCluster status saying connected): the samples are
	// taken after it. QuietStatus is what status said then (or at the
	// 10-minute bound).
	Quiet       time.Duration
	QuietStatus StatusCheck
}

func sampleServer(ctx context.Context, s *Server) (ServerSample, error) {
	u, err := s.Usage()
	if err != nil {
		return ServerSample{}, err
	}
	m, err := s.Metrics(ctx)
	if err != nil {
		return ServerSample{}, err
	}
	return ServerSample{RSS: u.RSS, Threads: u.Threads,
		HeapInuse: m.Sum("go_memstats_heap_inuse_bytes"), HeapAlloc: m.Sum("go_memstats_heap_alloc_bytes"),
		NextGC: m.Sum("go_memstats_next_gc_bytes"), StackInuse: m.Sum("go_memstats_stack_inuse_bytes"),
		Goroutines: m.Sum("go_goroutines"), OpenFDs: m.Sum("process_open_fds")}, nil
}

// Idle registers the fleet, samples the server, connects the fleet, lets
// it idle and samples again.
func Idle(ctx context.Context, cfg IdleConfig) (*IdleResult, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Agents < 1 {
		return nil, errors.New("idle: agents must be at least 1")
	}
	if cfg.PerSecond == 0 {
		cfg.PerSecond = 20
	}
	if cfg.Settle == 0 {
		cfg.Settle = 30 * time.Second
	}
	srv, err := cfg.startServer(ctx, "idle-server")
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	if cfg.Policy != "" {
		if err := cfg.Env.Mgmt.SetRequestTimeout(ctx, "fleet-idle", cfg.Policy); err != nil {
			return nil, err
		}
	}
	members, _, _, err := cfg.registerFleet(ctx, "idle", cfg.Agents)
	if err != nil {
		return nil, err
	}
	roots, err := cfg.Env.Mgmt.RelayRoots(ctx)
	if err != nil {
		return nil, err
	}
	time.Sleep(5 * time.Second)
	r := &IdleResult{Agents: cfg.Agents}
	if r.Before, err = sampleServer(ctx, srv); err != nil {
		return nil, err
	}
	fc := FleetConfig{Servers: []string{srv.Addr}, Roots: roots, Members: members,
		Snapshot: func(c string) *relaypb.Snapshot { return cfg.Snapshot.Snapshot(c) }}
	if cfg.NoSnapshot {
		fc.Snapshot = nil
	}
	f, err := NewFleet(fc)
	if err != nil {
		return nil, err
	}
	defer f.Stop()
	f.StartPaced(ctx, cfg.PerSecond)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	cond := Connected
	if cfg.Policy != "" {
		cond = Synced
	}
	err = f.Wait(wctx, "connected", func(st AgentState) bool { return cond(st) && (cfg.NoSnapshot || !st.Timeline.Pushed.IsZero()) })
	cancel()
	if err != nil {
		return nil, err
	}
	last := time.Time{}
	clusters := map[string]bool{}
	for _, st := range f.States() {
		clusters[st.Cluster] = true
		if st.Timeline.Session.After(last) {
			last = st.Timeline.Session
		}
	}
	want := cfg.Agents * len(DiscoveredObjectsOf(cfg.Snapshot.Snapshot("x")))
	if cfg.NoSnapshot {
		want = 0
	}
	qctx, qcancel := context.WithTimeout(ctx, 10*time.Minute)
	_, err = pollUntil(qctx, time.Second, func() (bool, error) {
		n, err := cfg.Env.Mgmt.DiscoveredObjects(ctx, clusters)
		if err != nil || n < want {
			return false, err
		}
		r.QuietStatus, err = checkStatus(ctx, cfg.Env.Mgmt, f)
		return r.QuietStatus.Correct == cfg.Agents, err
	})
	qcancel()
	r.Quiet = time.Since(last)
	if err != nil {
		cfg.Logf("idle: the server did not catch up within 10 minutes: %v (status %+v)", err, r.QuietStatus)
	}
	cfg.Logf("idle: %d agents connected; the server caught up %s after the last session; idling %s", cfg.Agents, r.Quiet.Round(time.Second), cfg.Settle)
	// The writes that follow a storm (status, mirror) settle first; the
	// CPU is measured over a second, quiet window.
	time.Sleep(cfg.Settle)
	meter, err := StartCPU(map[string]int{"server": srv.Pid()})
	if err != nil {
		return nil, err
	}
	stop := cfg.during(ctx, srv)
	time.Sleep(cfg.Settle)
	stop()
	w, err := meter.Stop()
	if err != nil {
		return nil, err
	}
	r.IdleCPU = w.CPU["server"].Seconds() / w.Wall.Seconds()
	if r.After, err = sampleServer(ctx, srv); err != nil {
		return nil, err
	}
	for _, st := range f.States() {
		if st.Connected {
			r.Connected++
		}
	}
	n := float64(cfg.Agents)
	r.PerAgentRSS = float64(r.After.RSS-r.Before.RSS) / n
	r.PerAgentHeapInuse = (r.After.HeapInuse - r.Before.HeapInuse) / n
	r.PerAgentLiveHeap = (r.After.NextGC - r.Before.NextGC) / 2 / n
	r.PerAgentStack = (r.After.StackInuse - r.Before.StackInuse) / n
	r.PerAgentGoroutines = (r.After.Goroutines - r.Before.Goroutines) / n
	f.Stop()
	if r.Hygiene, err = srv.CheckHygiene(members); err != nil {
		return nil, err
	}
	return r, nil
}
