// Package leader runs the management server's once-only work — status
// writing, orphan collection, the webhook's configuration — on one replica
// at a time, under a coordination.k8s.io Lease (client-go leaderelection).
//
// Every replica keeps serving agents whether it leads or not; only the tasks
// registered here wait for the Lease. A replica that cannot renew the Lease
// (cut off from the apiserver) cancels its tasks before another replica can
// take the Lease over: client-go's renew deadline is shorter than the lease
// duration. It then campaigns again.
package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Config configures an Elector.
type Config struct {
	// Client reaches the management cluster's apiserver.
	Client kubernetes.Interface
	// Namespace and Name of the Lease.
	Namespace, Name string
	// Identity names this replica in the Lease (holderIdentity); unique per
	// replica, e.g. the Pod's name.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's; defaults
	// 15s, 10s, 2s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Logger; never given a secret.
	Logger *slog.Logger
	// Registerer receives relaymesh_server_leader (1 while leading) and
	// relaymesh_server_leader_transitions_total; nil: not exported.
	Registerer prometheus.Registerer
}

func (c *Config) defaults() {
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 15 * time.Second
	}
	if c.RenewDeadline == 0 {
		c.RenewDeadline = 10 * time.Second
	}
	if c.RetryPeriod == 0 {
		c.RetryPeriod = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports every missing or inconsistent field.
func (c Config) Validate() error {
	c.defaults()
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("client: required"))
	}
	if c.Namespace == "" || c.Name == "" {
		errs = append(errs, errors.New("namespace and name of the Lease: required"))
	}
	if c.Identity == "" {
		errs = append(errs, errors.New("identity: required (unique per replica)"))
	}
	if c.RetryPeriod <= 0 || c.RenewDeadline <= c.RetryPeriod || c.LeaseDuration <= c.RenewDeadline {
		errs = append(errs, fmt.Errorf("need 0 < retry period (%s) < renew deadline (%s) < lease duration (%s)", c.RetryPeriod, c.RenewDeadline, c.LeaseDuration))
	}
	return errors.Join(errs...)
}

// A Task is once-only work. It runs while this replica leads and must
// return soon after ctx is done: the Lease is released, or left to expire,
// only after every task returned.
type Task struct {
	Name string
	Run  func(ctx context.Context)
}

// Elector campaigns for the Lease and runs the registered tasks while it
// holds it.
type Elector struct {
	cfg     Config
	log     *slog.Logger
	mu      sync.Mutex
	tasks   []Task
	leading atomic.Bool
	leader  atomic.Pointer[string]
	gauge   prometheus.Gauge
	terms   prometheus.Counter
	term    sync.WaitGroup  // a term's tasks are running
	stop    context.Context // Run's: done ends the term too
	// abstain: give up the Lease and do not campaign (Abstain);
	// abstainChanged is closed (and replaced) at every change.
	abstain        bool
	abstainChanged chan struct{}
}

// New returns an Elector; register tasks with Add before Run.
func New(cfg Config) (*Elector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("leader election: %w", err)
	}
	cfg.defaults()
	e := &Elector{cfg: cfg, log: cfg.Logger.With("lease", cfg.Namespace+"/"+cfg.Name, "identity", cfg.Identity), abstainChanged: make(chan struct{}),
		gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "relaymesh_server_leader", Help: "1 while this replica holds the server's Lease and runs its once-only work."}),
		terms: prometheus.NewCounter(prometheus.CounterOpts{Name: "relaymesh_server_leader_terms_total", Help: "Times this replica started leading."})}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(e.gauge); err != nil {
			return nil, err
		}
		if err := cfg.Registerer.Register(e.terms); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// Add registers a task; tasks added after Run start at the next term.
func (e *Elector) Add(t Task) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.tasks = append(e.tasks, t)
}

// Abstain makes this replica give up the Lease (its term ends: the tasks
// stop and the Lease is released, so another replica takes over at once)
// and stop campaigning while abstain is true; false lets it campaign
// again. A replica cut off from state the once-only work reads (the
// snapshot store) must not lead.
func (e *Elector) Abstain(abstain bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.abstain == abstain {
		return
	}
	e.abstain = abstain
	close(e.abstainChanged)
	e.abstainChanged = make(chan struct{})
	if abstain {
		e.log.Warn("abstaining: this replica gives up the Lease and does not campaign")
	} else {
		e.log.Info("campaigning again for the Lease")
	}
}

// abstaining reports Abstain's state and a channel closed at its next
// change.
func (e *Elector) abstaining() (bool, <-chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.abstain, e.abstainChanged
}

// Leading reports whether this replica holds the Lease now.
func (e *Elector) Leading() bool { return e.leading.Load() }

// Leader is the holder this replica saw last ("" before it saw one).
func (e *Elector) Leader() string {
	if p := e.leader.Load(); p != nil {
		return *p
	}
	return ""
}

// Run campaigns until ctx is done: it leads while it can renew, stops its
// tasks when it cannot, and campaigns again. On return (ctx done) it has
// released the Lease if it held it, after its tasks returned, so another
// replica takes over at once instead of after the lease duration.
func (e *Elector) Run(ctx context.Context) {
	// The elector's context outlives ctx until the tasks have stopped, so the
	// Lease is released only after them.
	leCtx, leCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer leCancel()
	go func() {
		<-ctx.Done()
		e.term.Wait()
		leCancel()
	}()
	e.stop = ctx
	for ctx.Err() == nil {
		if abstain, changed := e.abstaining(); abstain {
			select {
			case <-ctx.Done():
			case <-changed:
			}
			continue
		}
		lock, err := resourcelock.New(resourcelock.LeasesResourceLock, e.cfg.Namespace, e.cfg.Name,
			e.cfg.Client.CoreV1(), e.cfg.Client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: e.cfg.Identity})
		if err != nil {
			e.log.Error("leader election: cannot make the lock; retrying", "error", err)
			sleep(ctx, e.cfg.RetryPeriod)
			continue
		}
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: e.cfg.LeaseDuration, RenewDeadline: e.cfg.RenewDeadline, RetryPeriod: e.cfg.RetryPeriod,
			ReleaseOnCancel: true, Name: e.cfg.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: e.lead,
				OnStoppedLeading: func() {
					if e.leading.Swap(false) {
						e.gauge.Set(0)
						e.log.Warn("stopped leading: once-only work moves to another replica")
					}
				},
				OnNewLeader: func(id string) {
					e.leader.Store(&id)
					if id != e.cfg.Identity {
						e.log.Info("another replica leads", "leader", id)
					}
				},
			},
		})
		if err != nil {
			e.log.Error("leader election: bad configuration", "error", err)
			return
		}
		// A term also ends when the replica abstains.
		runCtx, cancelRun := context.WithCancel(leCtx)
		go func() {
			for {
				abstain, changed := e.abstaining()
				if abstain {
					cancelRun()
					return
				}
				select {
				case <-runCtx.Done():
					return
				case <-changed:
				}
			}
		}()
		le.Run(runCtx) // returns when leadership is lost, the replica abstains, or ctx is done and the tasks stopped
		cancelRun()
		if ctx.Err() == nil {
			sleep(ctx, e.cfg.RetryPeriod)
		}
	}
}

// lead runs every task for one term and returns when all have returned
// (lctx is cancelled when the term ends).
func (e *Elector) lead(leCtx context.Context) {
	e.term.Add(1)
	defer e.term.Done()
	lctx, cancel := context.WithCancel(leCtx)
	defer cancel()
	stop := context.AfterFunc(e.stop, cancel)
	defer stop()
	e.leading.Store(true)
	e.gauge.Set(1)
	e.terms.Inc()
	e.mu.Lock()
	tasks := append([]Task(nil), e.tasks...)
	e.mu.Unlock()
	e.log.Info("leading: this replica runs the once-only work", "tasks", len(tasks))
	var wg sync.WaitGroup
	for _, t := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(lctx)
		}()
	}
	<-lctx.Done()
	// The term is over: nothing may act as leader from now on, even while
	// the tasks are still stopping.
	if e.leading.Swap(false) {
		e.gauge.Set(0)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(e.cfg.RenewDeadline):
		e.log.Error("once-only work did not stop within the renew deadline")
	}
	if e.leading.Swap(false) {
		e.gauge.Set(0)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
