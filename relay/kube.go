package relay

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// KubernetesClusters is the resource of KubernetesCluster objects.
var KubernetesClusters = multiclusterv1alpha1.GroupVersion.WithResource("kubernetesclusters")

// WatchClusters feeds reg from the KubernetesCluster objects of namespace
// until ctx ends. Relay-mode clusters go to reg: only they may bootstrap an
// agent. Kubeconfig-mode clusters go to kubeconfig if it is not nil (the
// server opted in to holding cluster credentials), and are ignored with a
// warning otherwise. It returns once the first list is in the registries.
func WatchClusters(ctx context.Context, client dynamic.Interface, namespace string, reg, kubeconfig *Registry, log *slog.Logger) error {
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(client, 10*time.Minute, namespace, nil)
	inf := factory.ForResource(KubernetesClusters).Informer()
	apply := func(obj any) {
		kc, err := toCluster(obj)
		if err != nil {
			// Fail closed: a registration we cannot read is no registration.
			if u, ok := obj.(*unstructured.Unstructured); ok {
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
		reg.Set(Registration{Name: kc.Name, UID: string(kc.UID)})
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    apply,
		UpdateFunc: func(_, obj any) { apply(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if u, ok := obj.(*unstructured.Unstructured); ok {
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
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("KubernetesCluster watch did not sync: %w", ctx.Err())
	}
	return nil
}

func toCluster(obj any) (*multiclusterv1alpha1.KubernetesCluster, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("unexpected object %T", obj)
	}
	kc := &multiclusterv1alpha1.KubernetesCluster{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, kc); err != nil {
		return nil, err
	}
	return kc, nil
}

// KubeStatus writes agent facts to KubernetesCluster status. Writes happen
// on one background goroutine so the relay never waits for the API server;
// if the queue is full a write is dropped and logged (the next event
// rewrites the facts).
type KubeStatus struct {
	client    dynamic.Interface
	namespace string
	log       *slog.Logger
	queue     chan statusPatch
	now       func() time.Time
}

type statusPatch struct {
	cluster string
	status  map[string]any
}

// NewKubeStatus returns a sink; call Run.
func NewKubeStatus(client dynamic.Interface, namespace string, log *slog.Logger) *KubeStatus {
	return &KubeStatus{client: client, namespace: namespace, log: log.With("component", "cluster-status"), queue: make(chan statusPatch, 1024), now: time.Now}
}

// Run applies queued status patches until ctx ends.
func (k *KubeStatus) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-k.queue:
			body, err := json.Marshal(map[string]any{"status": p.status})
			if err != nil {
				continue
			}
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = k.client.Resource(KubernetesClusters).Namespace(k.namespace).Patch(wctx, p.cluster, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "relaymesh-server"}, "status")
			cancel()
			if err != nil {
				k.log.Warn("could not update KubernetesCluster status", "cluster", p.cluster, "error", err)
			}
		}
	}
}

func (k *KubeStatus) enqueue(p statusPatch) {
	select {
	case k.queue <- p:
	default:
		k.log.Warn("status queue full; dropping update", "cluster", p.cluster)
	}
}

// CertificateIssued implements StatusSink.
func (k *KubeStatus) CertificateIssued(cluster string, cert *x509.Certificate, version string) {
	st := map[string]any{
		"lastSeen": k.now().UTC().Format(time.RFC3339),
		"agentCertificate": map[string]any{
			"serial":   fmt.Sprintf("%x", cert.SerialNumber),
			"spiffeID": cert.URIs[0].String(),
			"notAfter": cert.NotAfter.UTC().Format(time.RFC3339),
		},
	}
	if version != "" {
		st["agentVersion"] = version
	}
	k.enqueue(statusPatch{cluster: cluster, status: st})
}

// SessionChanged implements StatusSink.
func (k *KubeStatus) SessionChanged(cluster string, connected bool) {
	k.enqueue(statusPatch{cluster: cluster, status: map[string]any{
		"connected": connected,
		"lastSeen":  k.now().UTC().Format(time.RFC3339),
	}})
}
