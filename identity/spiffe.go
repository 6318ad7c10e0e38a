package identity

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// ErrInvalidClusterName is returned for a cluster name that is not a DNS label.
var ErrInvalidClusterName = errors.New("invalid cluster name")

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// ValidateClusterName checks that name can be a cluster's identity: a DNS
// label of at most 63 characters, the same rule the KubernetesCluster CRD
// enforces.
func ValidateClusterName(name string) error {
	if len(name) == 0 || len(name) > 63 || !dnsLabel.MatchString(name) {
		return fmt.Errorf("%w: %q is not a DNS label (a-z, 0-9, '-', at most 63 characters)", ErrInvalidClusterName, name)
	}
	return nil
}

// AgentID is the SPIFFE ID of the agent of cluster in the relay trust domain.
func AgentID(td spiffeid.TrustDomain, cluster string) (spiffeid.ID, error) {
	if err := ValidateClusterName(cluster); err != nil {
		return spiffeid.ID{}, err
	}
	return spiffeid.FromSegments(td, "cluster", cluster, "agent")
}

// ClusterFromID returns the cluster an agent ID names, or an error if id is
// not exactly `spiffe://<td>/cluster/<name>/agent` with a valid name.
func ClusterFromID(td spiffeid.TrustDomain, id spiffeid.ID) (string, error) {
	if id.TrustDomain() != td {
		return "", fmt.Errorf("SPIFFE ID %s is not in trust domain %s", id, td)
	}
	seg := strings.Split(id.Path(), "/")
	if len(seg) != 4 || seg[0] != "" || seg[1] != "cluster" || seg[3] != "agent" {
		return "", fmt.Errorf("SPIFFE ID %s is not an agent ID", id)
	}
	if err := ValidateClusterName(seg[2]); err != nil {
		return "", fmt.Errorf("SPIFFE ID %s: %w", id, err)
	}
	return seg[2], nil
}
