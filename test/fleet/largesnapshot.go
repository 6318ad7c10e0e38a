package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relaymesh/relaymesh/agent"
	"github.com/relaymesh/relaymesh/internal/backoff"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/server"
	"go.step.sm/crypto/pemutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
)

// LargeSnapshotConfig pushes one large cluster's snapshot through a real
// server process, with the agent's own session code (agent.Session: parts
// of a chunked push).
type LargeSnapshotConfig struct {
	Options
	// Namespaces of the cluster (relaytest.Rich: 200 pods, 20 Deployments and
	// 20 Services each); default 500, i.e. 100,000 pods and 10,000
	// Services.
	Namespaces int
	// Pushes: how many changed snapshots are pushed after the first;
	// default 2.
	Pushes int
	// Mirrored, if set, bounds a wait after the pushes for the server to
	// have written every Mesh, Workload and Destination of the cluster as
	// the last snapshot has them (at its default client budget that takes
	// far longer than the pushes); the server's RSS is then read again:
	// what the cluster costs the server to hold, not just to take.
	Mirrored time.Duration
	// Settle (with Mirrored) is how long the server is then left alone
	// before its RSS is read a third time (RSSSettled): long enough for a
	// collection (the runtime forces one every 2 minutes) and for the
	// runtime to return freed pages, it is what the cluster costs held.
	Settle time.Duration
}

// LargeSnapshotResult is what one large cluster's snapshots cost.
type LargeSnapshotResult struct {
	Pods, Services, Workloads, Bytes int
	// First is the first snapshot of a new session, Changed each changed
	// one after it: from the agent's session taking the snapshot to the
	// server's ack, which the server sends once the snapshot is in its
	// view.
	First   time.Duration
	Changed []time.Duration
	// ServerCPU is the server process's CPU over all pushes.
	ServerCPU time.Duration
	// Server RSS before the first push, its peak during the pushes, and
	// after them.
	RSSBefore, RSSPeak, RSSAfter int64
	// ReservedAfter is the server's memory for snapshots in transit once
	// the pushes are done (relaymesh_snapshot_assembly_bytes): zero.
	ReservedAfter float64
	// Refused counts the snapshots the server refused, by reason.
	Refused map[string]float64
	// MirroredAfter (with Config.Mirrored) is the time from the last
	// push's ack until the management cluster held every discovered object
	// of the cluster (Objects of them) with the last snapshot's spec, and
	// RSSMirrored the server's RSS then; RSSMirroredPeak is its peak from
	// the first push until then.
	MirroredAfter                time.Duration
	Objects                      int
	RSSMirrored, RSSMirroredPeak int64
	// RSSSettled (with Config.Settle) is the server's RSS Settle after
	// the cluster was mirrored. RSS is what the runtime has not returned
	// to the system, which depends on when it last collected: LiveBefore
	// and LiveSettled are the live heap at the last collection before the
	// first push and before that read (next collection's goal / 2, at
	// GOGC=100), and GCsSettling how many collections ran while settling.
	RSSSettled              int64
	LiveBefore, LiveSettled float64
	GCsSettling             float64
}

// LargeSnapshot registers one cluster, bootstraps its agent, and pushes
// its snapshot of cfg's size, then cfg.Pushes changed ones; the pushes are
// the measured phase (Options.During).
func LargeSnapshot(ctx context.Context, cfg LargeSnapshotConfig) (*LargeSnapshotResult, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Namespaces == 0 {
		cfg.Namespaces = 500
	}
	if cfg.Pushes == 0 {
		cfg.Pushes = 2
	}
	srv, err := cfg.startServer(ctx, "large-snapshot-server")
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	members, _, _, err := cfg.registerFleet(ctx, "large", 1)
	if err != nil {
		return nil, err
	}
	cluster := members[0].Cluster
	roots, err := cfg.Env.Mgmt.RelayRoots(ctx)
	if err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(srv.Addr)
	serverOnly := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: host}
	cert, err := Bootstrap(ctx, srv.Addr, serverOnly, roots, members[0])
	if err != nil {
		return nil, err
	}

	cfg.Logf("building the snapshot of %d namespaces", cfg.Namespaces)
	snaps := []*relaypb.Snapshot{relaytest.Rich{Namespaces: cfg.Namespaces}.Snapshot(cluster)}
	for i := range cfg.Pushes {
		snaps = append(snaps, changed(snaps[0], i))
	}
	r := &LargeSnapshotResult{Pods: relaytest.Rich{Namespaces: cfg.Namespaces}.Pods(), Services: len(snaps[0].GetDestinations()),
		Workloads: len(snaps[0].GetWorkloads()), Bytes: proto.Size(snaps[0])}
	beforeSample, err := sampleServer(ctx, srv)
	if err != nil {
		return nil, err
	}
	r.LiveBefore = beforeSample.NextGC / 2
	before, err := srv.Usage()
	if err != nil {
		return nil, err
	}
	r.RSSBefore = before.RSS
	var peak atomic.Int64 // the sampler's; read at the end of each phase
	peak.Store(before.RSS)
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampleCtx.Err() == nil {
			if u, err := srv.Usage(); err == nil {
				if u.RSS > peak.Load() { // the only writer
					peak.Store(u.RSS)
				}
			}
			select {
			case <-sampleCtx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()

	src := &settableSource{snap: snaps[0], asked: map[string]time.Time{}, changes: make(chan struct{}, 1)}
	sess, err := agent.NewSession(agent.SessionConfig{ServerAddress: srv.Addr, Version: "fleet", Snapshots: src,
		TLS: func() (*tls.Config, error) {
			c := serverOnly.Clone()
			c.Certificates = []tls.Certificate{cert}
			return c, nil
		},
		Retry: backoff.Policy{Min: 100 * time.Millisecond, Max: time.Second}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		stopSampling()
		return nil, err
	}
	stopDuring := cfg.during(ctx, srv)
	defer stopDuring()
	sessCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = sess.Run(sessCtx) }()
	defer func() { stop(); <-done }()
	pushed := func(s *relaypb.Snapshot) (time.Duration, error) {
		deadline := time.Now().Add(5 * time.Minute)
		for sess.State().PushedHash != s.GetHash() {
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("snapshot %s not accepted within 5 minutes: %s", s.GetHash(), sess.State().PushError)
			}
			time.Sleep(time.Millisecond)
		}
		return time.Since(src.askedAt(s.GetHash())), nil
	}
	if r.First, err = pushed(snaps[0]); err != nil {
		stopSampling()
		return nil, err
	}
	cfg.Logf("first snapshot (%d bytes) in the server's view after %s", r.Bytes, r.First.Round(time.Millisecond))
	for _, s := range snaps[1:] {
		src.set(s)
		d, err := pushed(s)
		if err != nil {
			stopSampling()
			return nil, err
		}
		r.Changed = append(r.Changed, d)
		cfg.Logf("changed snapshot in the server's view after %s", d.Round(time.Millisecond))
	}
	pushedAt := time.Now()
	after, err := srv.Usage()
	if err != nil {
		stopSampling()
		return nil, err
	}
	r.ServerCPU, r.RSSAfter, r.RSSPeak = after.CPU-before.CPU, after.RSS, max(peak.Load(), after.RSS)
	if cfg.Mirrored > 0 {
		want, err := server.DiscoveredObjects(snaps[len(snaps)-1], cfg.Env.Mgmt.Namespace)
		if err != nil {
			stopSampling()
			return nil, err
		}
		sums := SpecSums(want)
		r.Objects = len(sums)
		if err := cfg.waitMirrored(ctx, cluster, sums, pushedAt.Add(cfg.Mirrored)); err != nil {
			stopSampling()
			return nil, err
		}
		r.MirroredAfter = time.Since(pushedAt)
		cfg.Logf("all %d discovered objects in the management cluster, as the last snapshot has them, %s after the last ack", r.Objects, r.MirroredAfter.Round(time.Second))
	}
	stopSampling()
	<-sampled
	if cfg.Mirrored > 0 {
		u, err := srv.Usage()
		if err != nil {
			return nil, err
		}
		r.RSSMirrored, r.RSSMirroredPeak = u.RSS, max(peak.Load(), u.RSS)
		if cfg.Settle > 0 {
			m, err := srv.Metrics(ctx)
			if err != nil {
				return nil, err
			}
			gcs := m.Sum("go_gc_duration_seconds_count")
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(cfg.Settle):
			}
			settled, err := sampleServer(ctx, srv)
			if err != nil {
				return nil, err
			}
			if m, err = srv.Metrics(ctx); err != nil {
				return nil, err
			}
			r.RSSSettled, r.LiveSettled, r.GCsSettling = settled.RSS, settled.NextGC/2, m.Sum("go_gc_duration_seconds_count")-gcs
			cfg.Logf("server RSS %d MiB once mirrored, %d MiB %s later (%.0f collections since; live heap %.0f MiB, %.0f MiB before the first push)",
				r.RSSMirrored>>20, r.RSSSettled>>20, cfg.Settle, r.GCsSettling, r.LiveSettled/(1<<20), r.LiveBefore/(1<<20))
		}
	}
	m, err := srv.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	r.ReservedAfter = m.Sum(server.MetricSnapshotAssembly)
	r.Refused = map[string]float64{}
	for _, reason := range []string{"invalid", "rate_limited", "framing", "too_large", "deadline", "idle", "slow", "memory", "preempted", "cluster_busy"} {
		if v := m.Sum(server.MetricSnapshotsRefused, `reason="`+reason+`"`); v > 0 {
			r.Refused[reason] = v
		}
	}
	return r, nil
}

// waitMirrored waits until the management cluster holds exactly the
// discovered objects of cluster in want (resource/name to spec sum), or
// deadline.
func (cfg LargeSnapshotConfig) waitMirrored(ctx context.Context, cluster string, want map[string]string, deadline time.Time) error {
	for {
		have, err := cfg.Env.Mgmt.DiscoveredSums(ctx, cluster)
		if err != nil {
			return err
		}
		right := 0
		for k, sum := range want {
			if have[k] == sum {
				right++
			}
		}
		if right == len(want) && len(have) == len(want) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d discovered objects of %s as the last snapshot has them (%d in all) by the deadline", right, len(want), cluster, len(have))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// changed is s with one label of one Service changed (and the hash that
// goes with it), the way a cluster changes between snapshots.
func changed(s *relaypb.Snapshot, i int) *relaypb.Snapshot {
	c := proto.Clone(s).(*relaypb.Snapshot)
	d := c.Destinations[len(c.Destinations)/2]
	if d.Labels == nil {
		d.Labels = map[string]string{}
	}
	d.Labels["fleet.relaymesh.io/change"] = fmt.Sprint(i)
	return relaytest.Rehash(c)
}

// Bootstrap obtains an agent certificate for member with its token from
// the server at addr, once.
func Bootstrap(ctx context.Context, addr string, serverOnly *tls.Config, roots *x509.CertPool, member Member) (tls.Certificate, error) {
	key, csr, err := NewCSR()
	if err != nil {
		return tls.Certificate{}, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(serverOnly)))
	if err != nil {
		return tls.Certificate{}, err
	}
	defer conn.Close()
	resp, err := relaypb.NewIdentityClient(conn).Bootstrap(ctx, &relaypb.BootstrapRequest{Cluster: member.Cluster, Token: member.Token, Csr: csr, AgentVersion: "fleet"})
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("bootstrap: %w", err)
	}
	block, err := pemutil.Serialize(key)
	if err != nil {
		return tls.Certificate{}, err
	}
	pair, err := tls.X509KeyPair(resp.GetCertificateChain(), pem.EncodeToMemory(block))
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := CheckCertificate(pair.Certificate, roots, member.Cluster, time.Now()); err != nil {
		return tls.Certificate{}, err
	}
	return pair, nil
}

// settableSource is a agent.SnapshotSource whose snapshot the scenario
// sets; it records when the session first took each one.
type settableSource struct {
	mu      sync.Mutex
	snap    *relaypb.Snapshot
	asked   map[string]time.Time
	changes chan struct{}
}

func (s *settableSource) Snapshot() (*relaypb.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.asked[s.snap.GetHash()]; !ok {
		s.asked[s.snap.GetHash()] = time.Now()
	}
	return s.snap, nil
}

func (s *settableSource) Changes() <-chan struct{} { return s.changes }

func (s *settableSource) set(snap *relaypb.Snapshot) {
	s.mu.Lock()
	s.snap = snap
	s.mu.Unlock()
	select {
	case s.changes <- struct{}{}:
	default:
	}
}

func (s *settableSource) askedAt(hash string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asked[hash]
}
