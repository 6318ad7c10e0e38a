package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ServerLease is the Lease the server's replicas elect a leader with; the
// holder runs the once-only work.
const ServerLease = "relaymesh-server"

// ReplicaLabel marks the Leases that say a replica is alive.
const ReplicaLabel = "relaymesh.io/server-replica"

// ReplicaLeaseName is the Lease a replica renews while it runs.
func ReplicaLeaseName(replica string) string { return "relaymesh-replica-" + replica }

// StoreAnnotation on a replica's Lease says whether the replica reaches
// the replicas' snapshot store: StoreReachable or StoreUnreachable (absent
// when the replicas use none).
const StoreAnnotation = "relaymesh.io/snapshot-store"

// Values of StoreAnnotation.
const (
	StoreReachable   = "reachable"
	StoreUnreachable = "unreachable"
)

// HeartbeatConfig configures Heartbeat.
type HeartbeatConfig struct {
	Client    kubernetes.Interface
	Namespace string
	// Replica is this replica's name; its Lease is ReplicaLeaseName(Replica).
	Replica string
	// Period between renewals; the Lease lasts 3 periods.
	Period time.Duration
	Logger *slog.Logger
	// Isolated, if set, hears when the replica has not renewed for as
	// long as its Lease lasts (true: the leader counts it gone and sweeps
	// its sessions; it cannot learn of deregistrations either) and when it
	// renews again (false).
	Isolated func(bool)
	// Store, if set, says at each renewal whether this replica reaches the
	// snapshot store (StoreAnnotation): the other replicas read it to tell
	// a replica cut off from the store from a store that is down.
	Store func() string
	// Annotations, if set, are written on this replica's Lease at each
	// renewal beside StoreAnnotation (the relay root rotation revision
	// the replica loaded); the other replicas read them in Replica.
	Annotations func() map[string]string
}

// Heartbeat renews this replica's Lease every period until ctx ends, so the
// leader can tell which replicas are alive (Alive); the Lease lasts
// 3 periods. A replica that cannot reach the apiserver stops renewing, and
// the leader counts it gone. As it stops, it deletes its Lease.
func Heartbeat(ctx context.Context, cfg HeartbeatConfig) {
	leases := cfg.Client.CoordinationV1().Leases(cfg.Namespace)
	name := ReplicaLeaseName(cfg.Replica)
	secs := int32(3 * cfg.Period / time.Second)
	lastOK, cut := time.Now(), false
	for {
		annotations := map[string]string{}
		if cfg.Annotations != nil {
			maps.Copy(annotations, cfg.Annotations())
		}
		if cfg.Store != nil {
			if store := cfg.Store(); store != "" {
				annotations[StoreAnnotation] = store
			}
		}
		// A renewal that hangs counts as failed after a period, and a
		// failed one is tried again after a tenth of one, not a whole
		// period: a hung renewal followed by a period's wait let the
		// 3-period Lease lapse, and the leader swept the sessions of a
		// replica that was alive and holding them (63 clusters marked
		// disconnected in a 1,000-agent fleet run on a loaded apiserver).
		rctx, cancel := context.WithTimeout(ctx, cfg.Period)
		err := renew(rctx, leases, cfg.Namespace, name, cfg.Replica, secs, annotations)
		cancel()
		wait := cfg.Period
		if err != nil {
			wait = cfg.Period / 10
		}
		switch {
		case err == nil:
			lastOK = time.Now()
			if cut {
				cut = false
				cfg.Logger.Info("this replica's Lease is renewed again", "lease", name)
				if cfg.Isolated != nil {
					cfg.Isolated(false)
				}
			}
		case ctx.Err() == nil:
			cfg.Logger.Warn("could not renew this replica's Lease", "lease", name, "error", err)
			if !cut && time.Since(lastOK) >= time.Duration(secs)*time.Second {
				cut = true
				if cfg.Isolated != nil {
					cfg.Isolated(true)
				}
			}
		}
		select {
		case <-ctx.Done():
			release(leases, name, cfg.Replica, cfg.Logger)
			return
		case <-time.After(wait):
		}
	}
}

// release deletes this replica's Lease as it stops, so the leader sweeps its
// sessions at once and no Lease of a gone pod is left behind. The delete is
// conditional on the Lease read, so a Lease renewed by a namesake since is
// kept.
func release(leases leaseClient, name, replica string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != replica {
		return
	}
	if err := leases.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &l.UID, ResourceVersion: &l.ResourceVersion}}); err != nil && !apierrors.IsNotFound(err) {
		log.Warn("could not delete this replica's Lease as it stops; the leader removes it later", "lease", name, "error", err)
	}
}

// releaseTimeout bounds the delete of a stopping replica's Lease.
const releaseTimeout = 2 * time.Second

// GoneAfter is how long after its Lease expired a replica's Lease is
// deleted by the leader (CollectGone): a pod that crashed or was cut off
// for that long has had its sessions swept long ago.
const GoneAfter = 10 * time.Minute

type leaseClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error)
	Create(ctx context.Context, l *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(ctx context.Context, l *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

func renew(ctx context.Context, leases leaseClient, namespace, name, replica string, secs int32, annotations map[string]string) error {
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{ReplicaLabel: "true"}, Annotations: annotations},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &replica, LeaseDurationSeconds: &secs, RenewTime: &now}}, metav1.CreateOptions{})
	case err == nil:
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &replica, &secs, &now
		if len(annotations) > 0 {
			if l.Annotations == nil {
				l.Annotations = map[string]string{}
			}
			maps.Copy(l.Annotations, annotations)
		}
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	return err
}

// Alive lists the replicas whose Lease is current.
func Alive(ctx context.Context, client kubernetes.Interface, namespace string) (map[string]bool, error) {
	reps, err := Replicas(ctx, client, namespace, time.Now())
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for name, r := range reps {
		if r.Alive {
			out[name] = true
		}
	}
	return out, nil
}

// Replica is what a replica's Lease says of it.
type Replica struct {
	// Alive: the Lease is current at the time asked.
	Alive bool
	// Store is its StoreAnnotation ("" if none), as of Renewed.
	Store string
	// Renewed is when it last renewed its Lease.
	Renewed time.Time
	// Annotations are its Lease's (HeartbeatConfig.Annotations), as of
	// Renewed.
	Annotations map[string]string
}

// Replicas reads every replica's Lease, by replica name, at now.
func Replicas(ctx context.Context, client kubernetes.Interface, namespace string, now time.Time) (map[string]Replica, error) {
	list, err := client.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{LabelSelector: ReplicaLabel + "=true"})
	if err != nil {
		return nil, err
	}
	out := map[string]Replica{}
	for _, l := range list.Items {
		s := l.Spec
		if s.HolderIdentity == nil || s.RenewTime == nil || s.LeaseDurationSeconds == nil {
			continue
		}
		out[*s.HolderIdentity] = Replica{Alive: s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second).After(now),
			Store: l.Annotations[StoreAnnotation], Renewed: s.RenewTime.Time, Annotations: l.Annotations}
	}
	return out, nil
}

// CollectGone deletes the replica Leases that expired more than GoneAfter
// before now, each only as it was listed (a replica that came back and
// renewed keeps its Lease). It returns the replicas whose Lease it deleted.
func CollectGone(ctx context.Context, client kubernetes.Interface, namespace string, now time.Time) ([]string, error) {
	leases := client.CoordinationV1().Leases(namespace)
	list, err := leases.List(ctx, metav1.ListOptions{LabelSelector: ReplicaLabel + "=true"})
	if err != nil {
		return nil, err
	}
	var gone []string
	var errs []error
	for _, l := range list.Items {
		if !expiredBefore(l.Spec, now.Add(-GoneAfter)) {
			continue
		}
		err := leases.Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &l.UID, ResourceVersion: &l.ResourceVersion}})
		switch {
		case err == nil:
			gone = append(gone, l.Name)
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		default:
			errs = append(errs, fmt.Errorf("delete Lease %s: %w", l.Name, err))
		}
	}
	return gone, errors.Join(errs...)
}

// expiredBefore reports whether a replica Lease ran out before t. A Lease
// without a renewal time or a duration was not written by Heartbeat and is
// never collected.
func expiredBefore(s coordinationv1.LeaseSpec, t time.Time) bool {
	if s.RenewTime == nil || s.LeaseDurationSeconds == nil {
		return false
	}
	return s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second).Before(t)
}
