package trust

import (
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"go.step.sm/crypto/pemutil"
)

// MeshCA is the public part of one mesh's plugged-in CA (its cacerts
// Secret without the key).
type MeshCA struct {
	Cluster, Namespace string
	Intermediate       *x509.Certificate   // ca-cert.pem
	Chain              []*x509.Certificate // cert-chain.pem
	Roots              []*x509.Certificate // root-cert.pem
}

// ParseMeshCA reads the public files of a cacerts Secret's data.
func ParseMeshCA(cluster, namespace string, data map[string][]byte) (*MeshCA, error) {
	m := &MeshCA{Cluster: cluster, Namespace: namespace}
	var err error
	if m.Intermediate, err = pemutil.ParseCertificate(data[KeyCACert]); err != nil {
		return nil, fmt.Errorf("%s/%s in %s: %s: %w", namespace, SecretName, cluster, KeyCACert, err)
	}
	if m.Chain, err = pemutil.ParseCertificateBundle(data[KeyChain]); err != nil {
		return nil, fmt.Errorf("%s/%s in %s: %s: %w", namespace, SecretName, cluster, KeyChain, err)
	}
	if m.Roots, err = pemutil.ParseCertificateBundle(data[KeyRootCert]); err != nil {
		return nil, fmt.Errorf("%s/%s in %s: %s: %w", namespace, SecretName, cluster, KeyRootCert, err)
	}
	return m, nil
}

// Name is "<cluster>/<namespace>".
func (m *MeshCA) Name() string { return m.Cluster + "/" + m.Namespace }

// VerifyAgainst checks that a workload certificate m's istiod issues would
// verify against other's root bundle at now: m's intermediate, through its
// chain, must verify to one of other's roots, and be a CA limited to path
// length 0.
func (m *MeshCA) VerifyAgainst(other *MeshCA, now time.Time) error {
	if !m.Intermediate.IsCA || !m.Intermediate.MaxPathLenZero || m.Intermediate.MaxPathLen != 0 {
		return errors.New("the intermediate is not a CA limited to path length 0")
	}
	return verifies(m.Intermediate, m.Chain, other.Roots, now)
}
