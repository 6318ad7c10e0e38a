package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// Heartbeat renews this replica's Lease every period until ctx ends, so the
// leader can tell which replicas are alive (Alive); the Lease lasts
// 3 periods. A replica that cannot reach the apiserver stops renewing, and
// the leader counts it gone.
//
// isolated, if set, hears when the replica has not renewed for as long as
// its Lease lasts (true: the leader counts it gone and sweeps its sessions;
// it cannot learn of deregistrations either) and when it renews again
// (false).
func Heartbeat(ctx context.Context, client kubernetes.Interface, namespace, replica string, period time.Duration, log *slog.Logger, isolated func(bool)) {
	leases := client.CoordinationV1().Leases(namespace)
	name := ReplicaLeaseName(replica)
	secs := int32(3 * period / time.Second)
	lastOK, cut := time.Now(), false
	for {
		// A renewal that hangs counts as failed once the Lease is over.
		rctx, cancel := context.WithTimeout(ctx, period)
		err := renew(rctx, leases, namespace, name, replica, secs)
		cancel()
		switch {
		case err == nil:
			lastOK = time.Now()
			if cut {
				cut = false
				log.Info("this replica's Lease is renewed again", "lease", name)
				if isolated != nil {
					isolated(false)
				}
			}
		case ctx.Err() == nil:
			log.Warn("could not renew this replica's Lease", "lease", name, "error", err)
			if !cut && time.Since(lastOK) >= time.Duration(secs)*time.Second {
				cut = true
				if isolated != nil {
					isolated(true)
				}
			}
		}
		select {
		case <-ctx.Done():
			release(leases, name, replica, log)
			return
		case <-time.After(period):
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

func renew(ctx context.Context, leases leaseClient, namespace, name, replica string, secs int32) error {
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{ReplicaLabel: "true"}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &replica, LeaseDurationSeconds: &secs, RenewTime: &now}}, metav1.CreateOptions{})
	case err == nil:
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &replica, &secs, &now
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	return err
}

// Alive lists the replicas whose Lease is current.
func Alive(ctx context.Context, client kubernetes.Interface, namespace string) (map[string]bool, error) {
	list, err := client.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{LabelSelector: ReplicaLabel + "=true"})
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	now := time.Now()
	for _, l := range list.Items {
		s := l.Spec
		if s.HolderIdentity == nil || s.RenewTime == nil || s.LeaseDurationSeconds == nil {
			continue
		}
		if s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second).After(now) {
			out[*s.HolderIdentity] = true
		}
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
