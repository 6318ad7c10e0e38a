// Package lease runs work on one replica at a time, under a
// coordination.k8s.io Lease (client-go leaderelection). It is the one
// leader-election loop of Relaymesh: the management server runs its
// once-only work under it (Elector.Run, which campaigns again after a lost
// term), and the agent applies under it (Elector.RunOneTerm, which ends
// with the first term so that the process exits and its supervisor
// restarts it as a standby).
//
// A replica that cannot renew the Lease (cut off from the apiserver)
// cancels its tasks before another replica can take the Lease over:
// client-go's renew deadline is shorter than the lease duration. On
// shutdown the tasks are stopped and waited for before the Lease is
// released, so another replica never starts while this one still works.
//
// It imports no role package: the server's Lease names and replica
// heartbeat stay in server/leader.
package lease

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
	// StopWait is how long the end of a term waits for its tasks before
	// the Lease is released (or left to expire) anyway; default
	// RenewDeadline.
	StopWait time.Duration
	// Logger; never given a secret.
	Logger *slog.Logger
	// Registerer receives Metrics; nil: not exported.
	Registerer prometheus.Registerer
	// Metrics are named by the caller (each role its own, constant names
	// listed in docs/metrics.md); required with Registerer, else optional.
	Metrics Metrics
}

// Metrics are an Elector's metrics.
type Metrics struct {
	// Leading is 1 while this replica leads.
	Leading prometheus.Gauge
	// Terms counts the terms this replica started.
	Terms prometheus.Counter
}

// ErrLost: a term ended because this replica could not renew the Lease.
var ErrLost = errors.New("lost leadership: could not renew the Lease")

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
	if c.StopWait == 0 {
		c.StopWait = c.RenewDeadline
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
	if c.StopWait < 0 {
		errs = append(errs, fmt.Errorf("stop wait (%s): must not be negative", c.StopWait))
	}
	if c.Registerer != nil && (c.Metrics.Leading == nil || c.Metrics.Terms == nil) {
		errs = append(errs, errors.New("metrics: required with a registerer"))
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
	metrics Metrics
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
		metrics: cfg.Metrics}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(e.metrics.Leading); err != nil {
			return nil, err
		}
		if err := cfg.Registerer.Register(e.metrics.Terms); err != nil {
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
func (e *Elector) Run(ctx context.Context) { _ = e.run(ctx, false) }

// RunOneTerm campaigns until this replica leads, runs the tasks for that
// one term and returns when it ends, after the tasks returned: nil when
// ctx is done (the Lease released), ErrLost when this replica could not
// renew the Lease. It never campaigns again: a process that exits on
// ErrLost comes back as a standby from its supervisor, so no work of an
// old term can overlap a new one.
func (e *Elector) RunOneTerm(ctx context.Context) error { return e.run(ctx, true) }

func (e *Elector) run(ctx context.Context, once bool) error {
	// The elector's context outlives ctx until the tasks have stopped, so the
	// Lease is released only after them.
	leCtx, leCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer leCancel()
	go func() {
		select {
		case <-ctx.Done():
		case <-leCtx.Done():
		}
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
		le, err := e.elector(lock)
		if err != nil {
			e.log.Error("leader election: bad configuration", "error", err)
			return err
		}
		// A term also ends when the replica abstains.
		runCtx, cancelRun := context.WithCancel(leCtx)
		go e.endTermOnAbstain(runCtx, cancelRun)
		le.Run(runCtx) // returns when leadership is lost, the replica abstains, or ctx is done and the tasks stopped
		// le.Run returns on its own only after a term it could not renew:
		// it campaigns until it leads or runCtx is done.
		lost := runCtx.Err() == nil
		cancelRun()
		if once && lost {
			e.term.Wait()
			if ctx.Err() != nil {
				return nil
			}
			return ErrLost
		}
		if ctx.Err() == nil {
			sleep(ctx, e.cfg.RetryPeriod)
		}
	}
	return nil
}

// elector makes the client-go elector of one campaign.
func (e *Elector) elector(lock resourcelock.Interface) (*leaderelection.LeaderElector, error) {
	return leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: e.cfg.LeaseDuration, RenewDeadline: e.cfg.RenewDeadline, RetryPeriod: e.cfg.RetryPeriod,
		ReleaseOnCancel: true, Name: e.cfg.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: e.lead,
			OnStoppedLeading: func() {
				if e.leading.Swap(false) {
					e.setLeading(0)
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
}

// endTermOnAbstain cancels a campaign (and its term) when the replica
// abstains; it returns when runCtx is done.
func (e *Elector) endTermOnAbstain(runCtx context.Context, cancelRun context.CancelFunc) {
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
	e.setLeading(1)
	if e.metrics.Terms != nil {
		e.metrics.Terms.Inc()
	}
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
		e.setLeading(0)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(e.cfg.StopWait):
		e.log.Error("once-only work did not stop in time; the term ends without it", "waited", e.cfg.StopWait)
	}
	if e.leading.Swap(false) {
		e.setLeading(0)
	}
}

func (e *Elector) setLeading(v float64) {
	if e.metrics.Leading != nil {
		e.metrics.Leading.Set(v)
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
