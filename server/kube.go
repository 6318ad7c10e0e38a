package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeinformers"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// WatchClusters feeds reg from the KubernetesCluster objects of namespace
// until ctx ends. Relay-mode clusters go to reg: only they may bootstrap an
// agent. Kubeconfig-mode clusters go to kubeconfig if it is not nil (the
// server opted in to holding cluster credentials), and are ignored with a
// warning otherwise. It returns once the first list is in the registries.
// informers are the process's shared informers (nil: its own).
func WatchClusters(ctx context.Context, client dynamic.Interface, informers *kubeinformers.Shared, namespace string, reg, kubeconfig *Registry, log *slog.Logger) error {
	informers = informers.OrNew(client, namespace)
	inf := informers.Local.Informer(multiclusterv1alpha1.KubernetesClusters)
	apply := func(obj any) {
		kc, err := toCluster(obj)
		if err != nil {
			// Fail closed: a registration we cannot read is no registration.
			if u, ok := obj.(metav1.Object); ok {
				reg.Remove(u.GetName())
				if kubeconfig != nil {
					kubeconfig.Remove(u.GetName())
				}
			}
			log.Error("unreadable KubernetesCluster; treating it as not registered", "error", err)
			return
		}
		if kc.DeletionTimestamp != nil {
			reg.Remove(kc.Name)
			if kubeconfig != nil {
				kubeconfig.Remove(kc.Name)
			}
			return
		}
		if kc.Spec.Mode == multiclusterv1alpha1.ModeKubeconfig {
			reg.Remove(kc.Name)
			if kubeconfig == nil || kc.Spec.KubeconfigSecretRef == nil {
				log.Warn("ignoring a cluster registered in kubeconfig mode: start the server with --allow-kubeconfig-clusters to manage it", "cluster", kc.Name)
				return
			}
			kubeconfig.Set(Registration{Name: kc.Name, UID: string(kc.UID), KubeconfigSecret: kc.Spec.KubeconfigSecretRef.Name})
			return
		}
		if kubeconfig != nil {
			kubeconfig.Remove(kc.Name)
		}
		reg.Watched(Registration{Name: kc.Name, UID: string(kc.UID)})
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    apply,
		UpdateFunc: func(_, obj any) { apply(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if u, ok := obj.(metav1.Object); ok {
				reg.Remove(u.GetName())
				if kubeconfig != nil {
					kubeconfig.Remove(u.GetName())
				}
			}
		},
	})
	if err != nil {
		return err
	}
	// A miss (the watch lags) reads the one object; a registration read so
	// that the watch does not confirm within a minute is read again, and
	// dropped if it is gone.
	fetch := func(ctx context.Context, name string) (Registration, bool, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		u, err := client.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return Registration{}, false, nil
		}
		if err != nil {
			return Registration{}, false, err
		}
		kc, err := toCluster(u)
		if err != nil || kc.DeletionTimestamp != nil || kc.Spec.Mode == multiclusterv1alpha1.ModeKubeconfig {
			return Registration{}, false, err
		}
		return Registration{Name: kc.Name, UID: string(kc.UID)}, true, nil
	}
	reg.SetFetch(fetch)
	go func() {
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for _, name := range reg.Unconfirmed(time.Minute) {
				cur, ok, err := fetch(ctx, name)
				switch {
				case err != nil:
					log.Warn("cannot re-read a KubernetesCluster the watch has not shown", "cluster", name, "error", err)
				case !ok:
					reg.Remove(name)
				default:
					reg.Watched(cur) // still there: the watch will say so too
				}
			}
		}
	}()
	informers.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("KubernetesCluster watch did not sync: %w", ctx.Err())
	}
	return nil
}

// toCluster is a watched KubernetesCluster, typed: the cached object itself
// (kubeinformers.Typed: shared, read only), or a conversion of one the
// cache kept as read because it does not convert.
func toCluster(obj any) (*multiclusterv1alpha1.KubernetesCluster, error) {
	kc, err := kubeinformers.As[multiclusterv1alpha1.KubernetesCluster](obj)
	if err == nil && kc == nil {
		err = fmt.Errorf("unexpected object %T", obj)
	}
	return kc, err
}
