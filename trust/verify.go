package trust

import (
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
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

// CheckTrustDomain reports whether m's intermediate can sign identities of
// trust domain td only: critical name constraints that permit URIs of
// exactly td (and none of its subdomains) and constrain nothing else. An
// unconstrained intermediate could sign any mesh's identities.
func (m *MeshCA) CheckTrustDomain(td string) error {
	c := m.Intermediate
	switch {
	case len(c.PermittedURIDomains) == 0:
		return fmt.Errorf("the intermediate is not name-constrained: it can sign identities of any trust domain, not only %q", td)
	case !slices.Equal(c.PermittedURIDomains, []string{td}):
		return fmt.Errorf("the intermediate may sign identities of %q, but the mesh's trust domain is %q", c.PermittedURIDomains, td)
	case !slices.Equal(c.ExcludedURIDomains, []string{"." + td}):
		return fmt.Errorf("the intermediate does not exclude the subdomains of %q (it excludes %q)", td, c.ExcludedURIDomains)
	case !c.PermittedDNSDomainsCritical:
		return errors.New("the intermediate's name constraints are not critical")
	}
	return nil
}

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
