package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/server/acks"
	"github.com/relaymesh/relaymesh/server/heads"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// ServerLease is the Lease the server's replicas elect their leader with
// (`relaymesh server --leader-elect`, docs/design/2026-11-25-high-availability.md).
const ServerLease = "relaymesh-server"

// Replica is one `relaymesh server` of several, started with
// --replica-name Name against the environment's one management apiserver.
type Replica struct {
	// Name is its --replica-name: what the Lease's holderIdentity and
	// KubernetesCluster status.replica say.
	Name string
	*Server
}

// ReplicaName is the --replica-name of the i-th replica the harness starts.
func ReplicaName(i int) string { return "replica-" + strconv.Itoa(i) }

// startReplicas starts n servers as replicas (replica-0 … replica-(n-1)),
// each on its own relay and metrics ports of 127.0.0.1 (the serving
// certificate names 127.0.0.1 by default, so agents verify every replica
// under one name), with its own log and audit log (<prefix>-replica-i).
// replica-0 starts alone first, so only it generates the relay CA; the
// others start after it published the CA. On error, the ones started are
// stopped.
func (o *Options) startReplicas(ctx context.Context, prefix string, n int) ([]*Replica, error) {
	if n < 1 {
		return nil, errors.New("replicas: at least one is required")
	}
	var out []*Replica
	for i := range n {
		name := ReplicaName(i)
		s, err := o.Env.StartServer(ctx, prefix+"-"+name, func(c *ServerConfig) {
			c.Args = append(append([]string{}, o.ServerArgs...), "--replica-name", name)
			c.Env, c.LogLevel = o.ServerEnv, o.LogLevel
		})
		if err != nil {
			for _, r := range out {
				_ = r.Stop()
			}
			return nil, fmt.Errorf("replica %s: %w", name, err)
		}
		out = append(out, &Replica{Name: name, Server: s})
	}
	return out, nil
}

// LeaseHolder reads the holderIdentity of the server's Lease ("" when the
// Lease does not exist or names nobody).
func (m *Management) LeaseHolder(ctx context.Context) (string, error) {
	l, err := m.Kube.CoordinationV1().Leases(m.Namespace).Get(ctx, ServerLease, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if l.Spec.HolderIdentity == nil {
		return "", nil
	}
	return *l.Spec.HolderIdentity, nil
}

// OutputHeads reads the output heads the leader wrote (ConfigMaps
// relaymesh-output-heads-NN, one "VERSION DIGEST" per cluster): each
// cluster's current version. An entry that does not parse is an error: the
// harness reads what a replica wrote.
func (m *Management) OutputHeads(ctx context.Context) (map[string]uint64, error) {
	list, err := m.Kube.CoreV1().ConfigMaps(m.Namespace).List(ctx, metav1.ListOptions{LabelSelector: heads.Label + "=true"})
	if err != nil {
		return nil, fmt.Errorf("output heads: %w", err)
	}
	out := map[string]uint64{}
	for _, cm := range list.Items {
		for cluster, v := range cm.Data {
			ver, _, _ := strings.Cut(v, " ")
			n, err := strconv.ParseUint(ver, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("output head of %s in %s: %q is not VERSION DIGEST", cluster, cm.Name, truncate(v, 100))
			}
			out[cluster] = n
		}
	}
	return out, nil
}

// ReplicaStatus is what a KubernetesCluster's status says about the
// replica holding its agent's session and the agent's last ack.
type ReplicaStatus struct {
	Connected bool
	Replica   string
	// Applied is the latest version the agent acked as the servers record
	// it: the ack ledger's (acks.Ledger, several replicas), or
	// status.appliedOutputs.version when later — the status moves on with
	// the heartbeat when only the version changed (0: none).
	Applied uint64
}

// ReplicaStatuses reads every KubernetesCluster of the namespace.
func (m *Management) ReplicaStatuses(ctx context.Context) (map[string]ReplicaStatus, error) {
	list, err := m.Dynamic.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(m.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	recorded, err := acks.Read(ctx, m.Kube, m.Namespace)
	if err != nil {
		return nil, fmt.Errorf("ack ledger: %w", err)
	}
	out := make(map[string]ReplicaStatus, len(list.Items))
	for _, u := range list.Items {
		kc := &multiclusterv1alpha1.KubernetesCluster{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, kc); err != nil {
			return nil, fmt.Errorf("KubernetesCluster %s: %w", u.GetName(), err)
		}
		st := ReplicaStatus{Connected: kc.Status.Connected, Replica: kc.Status.Replica}
		if a := kc.Status.AppliedOutputs; a != nil {
			if st.Applied, err = strconv.ParseUint(a.Version, 10, 64); err != nil {
				return nil, fmt.Errorf("KubernetesCluster %s: appliedOutputs.version %q: %w", kc.Name, truncate(a.Version, 40), err)
			}
		}
		st.Applied = max(st.Applied, recorded[kc.Name].Version)
		out[kc.Name] = st
	}
	return out, nil
}

// EtcdBytes reads the management apiserver's apiserver_storage_size_bytes
// (the size of etcd's database file, summed over the storage clusters).
func (m *Management) EtcdBytes(ctx context.Context) (float64, error) {
	raw, err := m.Kube.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("API server metrics: %w", err)
	}
	mets := ParseMetrics(string(raw))
	for series := range mets {
		if strings.HasPrefix(series, "apiserver_storage_size_bytes") {
			return mets.Sum("apiserver_storage_size_bytes"), nil
		}
	}
	return 0, errors.New("API server metrics: apiserver_storage_size_bytes not exported")
}

// APIWrites are the management apiserver's write requests (every verb but
// GET, LIST and WATCH) in a window.
type APIWrites struct {
	Window    time.Duration
	Total     float64
	PerSecond float64
	// ByRequest counts them by "VERB resource[/subresource]".
	ByRequest map[string]float64
}

// writesOf keeps the writes of an APIRequests difference.
func writesOf(delta map[string]float64, window time.Duration) APIWrites {
	w := APIWrites{Window: window, ByRequest: map[string]float64{}}
	for k, v := range delta {
		verb, _, _ := strings.Cut(k, " ")
		switch verb {
		case "GET", "LIST", "WATCH":
			continue
		}
		w.ByRequest[k] = v
		w.Total += v
	}
	if window > 0 {
		w.PerSecond = w.Total / window.Seconds()
	}
	return w
}

// LoadAverage is /proc/loadavg's first three fields, for the record of how
// busy the machine was.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
