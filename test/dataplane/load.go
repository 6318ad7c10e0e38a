package dataplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/status"
)

// Flow is one direction of a Load: a workload calling a host.
type Flow struct {
	// Name labels the flow's counts.
	Name string
	// From is the calling workload.
	From *Workload
	// Host and Port are what it dials (xds:///Host:Port).
	Host string
	Port int32
}

// LoadConfig shapes a Load.
type LoadConfig struct {
	// Flows are the directions of traffic. At least one.
	Flows []Flow
	// Rate is each flow's target, in RPCs per second. Required.
	Rate int
	// Workers are each flow's concurrent callers; default 4. They share
	// one client (one gRPC channel) for the whole load, as an application
	// does. For new TLS handshakes while the load runs, give the servers a
	// MaxConnectionAge.
	Workers int
	// Timeout is each call's deadline; default 5s.
	Timeout time.Duration
}

// Segment is a stretch of a Load between two marks: every RPC that ended
// in it, counted per flow.
type Segment struct {
	Name       string
	Start, End time.Time
	Flows      map[string]*Outcomes
}

// Total is every flow's outcomes together.
func (s *Segment) Total() *Outcomes {
	out := NewOutcomes()
	for _, o := range s.Flows {
		out.Merge(o)
	}
	return out
}

// Duration is how long the segment lasted.
func (s *Segment) Duration() time.Duration { return s.End.Sub(s.Start) }

// Rate is the flow's RPCs per second in the segment.
func (s *Segment) Rate(flow string) float64 {
	d := s.Duration().Seconds()
	if d <= 0 {
		return 0
	}
	return float64(s.Flows[flow].Total()) / d
}

// Load calls hosts continuously, at a steady rate per flow, and counts
// every RPC's outcome in the segment it ended in. Tests mark segments
// (a phase of a rotation, say) while it runs.
type Load struct {
	cfg     LoadConfig
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	clients []*Client // one per flow

	mu   sync.Mutex
	cur  *Segment
	segs []*Segment
}

// StartLoad starts the flows; the first segment is named first.
func StartLoad(first string, cfg LoadConfig) (*Load, error) {
	var errs []error
	if len(cfg.Flows) == 0 {
		errs = append(errs, errors.New("flows: at least one"))
	}
	seen := map[string]bool{}
	for i, f := range cfg.Flows {
		if f.Name == "" || seen[f.Name] || f.From == nil {
			errs = append(errs, fmt.Errorf("flows[%d]: a unique name and a workload are required", i))
		}
		seen[f.Name] = true
	}
	if cfg.Rate < 1 || cfg.Rate > 10_000 {
		errs = append(errs, fmt.Errorf("rate: %d is outside [1, 10000]", cfg.Rate))
	}
	if cfg.Workers == 0 {
		cfg.Workers = 4
	}
	if cfg.Workers < 1 || cfg.Workers > 64 {
		errs = append(errs, fmt.Errorf("workers: %d is outside [1, 64]", cfg.Workers))
	}
	if cfg.Timeout < 0 {
		errs = append(errs, errors.New("timeout: must not be negative"))
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	clients := make([]*Client, len(cfg.Flows))
	for i, f := range cfg.Flows {
		c, err := f.From.DialHost(f.Host, f.Port)
		if err != nil {
			for _, c := range clients[:i] {
				c.Close()
			}
			return nil, fmt.Errorf("load: flow %s: %w", f.Name, err)
		}
		clients[i] = c
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Load{cfg: cfg, cancel: cancel, clients: clients}
	l.cur = l.newSegment(first, time.Now())
	for i, f := range cfg.Flows {
		tokens := make(chan struct{}, max(cfg.Rate/2, 1))
		l.wg.Go(func() { pace(ctx, cfg.Rate, tokens) })
		for range cfg.Workers {
			l.wg.Go(func() { l.work(ctx, f.Name, clients[i], tokens) })
		}
	}
	return l, nil
}

func (l *Load) newSegment(name string, start time.Time) *Segment {
	s := &Segment{Name: name, Start: start, Flows: map[string]*Outcomes{}}
	for _, f := range l.cfg.Flows {
		s.Flows[f.Name] = NewOutcomes()
	}
	return s
}

// pace puts rate tokens a second into tokens, in 10ms steps. Up to half a
// second's tokens wait for workers that fell behind (a stall is made up
// for); more are dropped (the rate a segment reached is what Rate
// reports).
func pace(ctx context.Context, rate int, tokens chan<- struct{}) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	start, sent := time.Now(), 0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			due := int(now.Sub(start).Seconds() * float64(rate))
			for ; sent < due; sent++ {
				select {
				case tokens <- struct{}{}:
				default:
				}
			}
		}
	}
}

// work calls the flow's host once per token.
func (l *Load) work(ctx context.Context, flow string, c *Client, tokens <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-tokens:
		}
		r, issuer, err := c.call(ctx, CallOptions{Timeout: l.cfg.Timeout})
		if ctx.Err() != nil {
			return // stopped mid-call: not an outcome of the traffic
		}
		st := status.Convert(err)
		l.mu.Lock()
		l.cur.Flows[flow].add(st.Code(), r, issuer, st.Message())
		l.mu.Unlock()
	}
}

// Mark ends the current segment and starts one named name.
func (l *Load) Mark(name string) *Segment {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	done := l.cur
	done.End = now
	l.segs = append(l.segs, done)
	l.cur = l.newSegment(name, now)
	return done
}

// Stop ends the load, closes its clients and returns every segment, in
// order.
func (l *Load) Stop() []*Segment {
	l.cancel()
	l.wg.Wait()
	for _, c := range l.clients {
		c.Close()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cur.End = time.Now()
	return append(l.segs, l.cur)
}
