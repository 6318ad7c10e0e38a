package v1alpha1

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"
)

// Labels every discovered object carries: where it came from, as the agent's
// certificate and snapshot say. The object's name is derived from the same
// values (Name), never the other way round.
const (
	// LabelCluster is the registered cluster the object was discovered in.
	LabelCluster = "relaymesh.io/cluster"
	// LabelNamespace is its namespace in that cluster.
	LabelNamespace = "relaymesh.io/namespace"
	// LabelName is its name in that cluster, when that fits a label value
	// (63 characters); the spec always carries it.
	LabelName = "relaymesh.io/name"
)

// Kinds of origin a discovered object's name is derived from.
const (
	OriginMesh        = "Mesh"
	OriginService     = "Service"
	OriginDeployment  = "Deployment"
	OriginStatefulSet = "StatefulSet"
	OriginDaemonSet   = "DaemonSet"
)

const (
	// namePrefixMax bounds the readable part of a name: with the hash the
	// name fits a DNS label, a label value and an intermediate CA's common
	// name ("<name> intermediate", 64 bytes).
	namePrefixMax = 34
	// nameHashLen base32 characters carry 80 bits of SHA-256: finding a
	// second origin with the same name is out of reach.
	nameHashLen = 16
)

var nameEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Name is the name of a discovered object in the management cluster for an
// object of kind (OriginMesh, OriginService or a workload's controller kind)
// named name in namespace of cluster: a readable prefix
// `<name>-<namespace>-<cluster>`, cut to fit, then a hash of the exact four
// values. Two different origins never share a name (the hash covers every
// value, separated so that no value can run into the next), so no cluster can
// claim another's object by choosing its names, and nothing needs to parse a
// name back into its parts. The result is a DNS label of at most 51
// characters.
func Name(kind, cluster, namespace, name string) string {
	h := sha256.New()
	for _, part := range []string{"relaymesh.io/discovered/v1", kind, cluster, namespace, name} {
		// Length-prefixed: ("a-b", "c") and ("a", "b-c") differ.
		h.Write([]byte{byte(len(part) >> 8), byte(len(part))})
		h.Write([]byte(part))
	}
	sum := nameEncoding.EncodeToString(h.Sum(nil))[:nameHashLen]
	prefix := []byte(strings.ToLower(name + "-" + namespace + "-" + cluster))
	for i, c := range prefix {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			prefix[i] = '-'
		}
	}
	p := string(prefix)
	if len(p) > namePrefixMax {
		p = p[:namePrefixMax]
	}
	p = strings.Trim(p, "-")
	if p == "" {
		return "x-" + sum
	}
	return p + "-" + sum
}

// WorkloadOrigin is the origin kind of a workload controller kind; ok is
// false for anything but Deployment, StatefulSet and DaemonSet.
func WorkloadOrigin(kind string) (string, bool) {
	switch kind {
	case OriginDeployment, OriginStatefulSet, OriginDaemonSet:
		return kind, true
	}
	return "", false
}
