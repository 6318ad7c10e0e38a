package relay

import (
	"errors"
	"fmt"

	"github.com/relaymesh/relaymesh/discovery"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/validation"
)

// SnapshotLimits bound what one agent may push.
type SnapshotLimits struct {
	// MaxBytes of one encoded snapshot; default 4 MiB (gRPC's message limit).
	MaxBytes int
	// MaxObjects is meshes + workloads + destinations; default 50,000.
	MaxObjects int
	// MaxEndpoints per destination; default 10,000.
	MaxEndpoints int
	// MaxLabels per label map; default 64. MaxPorts per destination; default 64.
	MaxLabels, MaxPorts int
}

func (l SnapshotLimits) withDefaults() SnapshotLimits {
	if l.MaxBytes == 0 {
		l.MaxBytes = 4 << 20
	}
	if l.MaxObjects == 0 {
		l.MaxObjects = 50000
	}
	if l.MaxEndpoints == 0 {
		l.MaxEndpoints = 10000
	}
	if l.MaxLabels == 0 {
		l.MaxLabels = 64
	}
	if l.MaxPorts == 0 {
		l.MaxPorts = 64
	}
	return l
}

// ErrSnapshotRefused wraps every reason a snapshot is refused.
var ErrSnapshotRefused = errors.New("snapshot refused")

// ValidateSnapshot checks a snapshot pushed by cluster's agent: every object
// belongs to cluster, names are valid Kubernetes names whose discovered
// names (`<name>-<namespace>-<cluster>`) fit, nothing is duplicated, sizes
// are within limits, and the hash matches the content. It reports the first
// problem with its path; a refused snapshot never replaces the last good one.
func ValidateSnapshot(cluster string, s *relaypb.Snapshot, limits SnapshotLimits) error {
	l := limits.withDefaults()
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrSnapshotRefused, fmt.Sprintf(format, args...))
	}
	if s == nil {
		return refuse("empty message")
	}
	if n := proto.Size(s); n > l.MaxBytes {
		return refuse("%d bytes, at most %d", n, l.MaxBytes)
	}
	if s.GetCluster() != cluster {
		return refuse("cluster %q, but the agent's certificate names %q", s.GetCluster(), cluster)
	}
	if n := len(s.GetMeshes()) + len(s.GetWorkloads()) + len(s.GetDestinations()); n > l.MaxObjects {
		return refuse("%d objects, at most %d", n, l.MaxObjects)
	}
	if want := discovery.Hash(s); s.GetHash() != want {
		return refuse("hash %q does not match the content", truncate(s.GetHash(), 80))
	}
	seen := map[string]bool{}
	discovered := map[string]string{} // discovered name -> the object that claimed it
	check := func(kind, subkind string, i int, name, namespace, objCluster string, labelMaps ...map[string]string) error {
		path := fmt.Sprintf("%s[%d]", kind, i)
		if objCluster != cluster {
			return refuse("%s: cluster %q is not the agent's cluster %q", path, truncate(objCluster, 80), cluster)
		}
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return refuse("%s: name %q: %s", path, truncate(name, 80), errs[0])
		}
		if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
			return refuse("%s: namespace %q: %s", path, truncate(namespace, 80), errs[0])
		}
		dn := DiscoveredName(name, namespace, cluster)
		if kind == "workloads" {
			dn = WorkloadName(&relaypb.Workload{Name: name, Namespace: namespace, Cluster: cluster, Kind: subkind})
		}
		if len(dn) > validation.DNS1123SubdomainMaxLength {
			return refuse("%s: discovered name %s is longer than %d characters", path, truncate(dn, 80), validation.DNS1123SubdomainMaxLength)
		}
		// `<name>-<namespace>-<cluster>` is ambiguous when names contain
		// '-': two objects must not claim the same discovered name.
		if other, dup := discovered[kind+"/"+dn]; dup && other != namespace+"/"+name {
			return refuse("%s: %s/%s and %s map to the same discovered name %s", path, namespace, name, other, dn)
		}
		discovered[kind+"/"+dn] = namespace + "/" + name
		key := kind + "/" + subkind + "/" + namespace + "/" + name
		if seen[key] {
			return refuse("%s: %s/%s appears twice", path, namespace, name)
		}
		seen[key] = true
		for _, m := range labelMaps {
			if len(m) > l.MaxLabels {
				return refuse("%s: %d labels, at most %d", path, len(m), l.MaxLabels)
			}
			for k, v := range m {
				if errs := validation.IsQualifiedName(k); len(errs) > 0 {
					return refuse("%s: label key %q: %s", path, truncate(k, 80), errs[0])
				}
				if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
					return refuse("%s: label value %q: %s", path, truncate(v, 80), errs[0])
				}
			}
		}
		return nil
	}
	for i, m := range s.GetMeshes() {
		if err := check("meshes", "", i, m.GetName(), m.GetNamespace(), m.GetCluster(), m.GetPodLabels()); err != nil {
			return err
		}
		if len(m.GetGateways()) > l.MaxPorts {
			return refuse("meshes[%d]: %d gateways, at most %d", i, len(m.GetGateways()), l.MaxPorts)
		}
	}
	for i, w := range s.GetWorkloads() {
		switch w.GetKind() {
		case "Deployment", "StatefulSet", "DaemonSet":
		default:
			return refuse("workloads[%d]: kind %q is not Deployment, StatefulSet or DaemonSet", i, truncate(w.GetKind(), 40))
		}
		if err := check("workloads", w.GetKind(), i, w.GetName(), w.GetNamespace(), w.GetCluster(), w.GetPodLabels()); err != nil {
			return err
		}
	}
	for i, d := range s.GetDestinations() {
		if err := check("destinations", "", i, d.GetName(), d.GetNamespace(), d.GetCluster(), d.GetSelector(), d.GetLabels()); err != nil {
			return err
		}
		if len(d.GetPorts()) > l.MaxPorts {
			return refuse("destinations[%d]: %d ports, at most %d", i, len(d.GetPorts()), l.MaxPorts)
		}
		if len(d.GetEndpoints()) > l.MaxEndpoints {
			return refuse("destinations[%d]: %d endpoints, at most %d", i, len(d.GetEndpoints()), l.MaxEndpoints)
		}
	}
	return nil
}

// DiscoveredName is the name of a discovered object in the management
// cluster: `<name>-<namespace>-<cluster>`.
func DiscoveredName(name, namespace, cluster string) string {
	return name + "-" + namespace + "-" + cluster
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
