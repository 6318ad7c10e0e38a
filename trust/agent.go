package trust

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/ca"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"go.step.sm/crypto/keyutil"
	"go.step.sm/crypto/pemutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Istio's plugged-in CA secret and its keys.
const (
	SecretName  = "cacerts"
	KeyCACert   = "ca-cert.pem"
	KeyCAKey    = "ca-key.pem"
	KeyChain    = "cert-chain.pem"
	KeyRootCert = "root-cert.pem"

	// IssuerAnnotation records the root the intermediate chains to.
	IssuerAnnotation = "relaymesh.io/issuer"
	// CrossIssuerAnnotation records the root that signs the intermediate
	// too, in a CrossSigned rotation's steps 1 and 2.
	CrossIssuerAnnotation = "relaymesh.io/cross-issuer"

	defaultRenewAtPercent = 66
	// maxSecretBytes bounds what the agent accepts from the server for one
	// secret (chain and bundle).
	maxSecretBytes = 256 << 10
)

// SignFunc asks the server to sign an intermediate (Trust.SignIntermediate).
type SignFunc func(ctx context.Context, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error)

// Agent keeps the cacerts Secrets an output set asks for: it generates each
// intermediate's key in the cluster, sends only a CSR, checks what comes
// back, and writes the Secret. It renews an intermediate once
// renewAtPercent of its life is gone, and deletes the cacerts Secrets it
// manages that are no longer asked for.
type Agent struct {
	Client kubernetes.Interface
	// Owner is the value of outputs.OwnerLabel on the Secrets it writes.
	Owner  string
	Logger *slog.Logger
	Clock  func() time.Time
}

// Apply makes the cluster's cacerts Secrets match set.Trust. It returns one
// result per Secret, and when it should run again (the earliest renewal;
// zero if nothing to renew).
func (a *Agent) Apply(ctx context.Context, set *relaypb.OutputSet, sign func(context.Context, *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error)) ([]*relaypb.ObjectResult, time.Time) {
	now := a.now()
	var (
		results []*relaypb.ObjectResult
		next    time.Time
	)
	wanted := map[string]bool{}
	for _, req := range set.GetTrust() {
		wanted[req.GetNamespace()] = true
		outcome, renewAt, err := a.keep(ctx, req, sign, now)
		r := &relaypb.ObjectResult{ApiVersion: "v1", Kind: "Secret", Namespace: req.GetNamespace(), Name: SecretName, Outcome: outcome}
		if err == nil && !req.GetHold() {
			// What the server counts a CrossSigned step's ack by.
			r.CrossIssuer = req.GetCrossIssuer()
		}
		if err != nil {
			r.Error = err.Error()
			a.log().Error("mesh CA not written", "namespace", req.GetNamespace(), "mesh", req.GetMesh(), "error", err)
			// Try again soon.
			renewAt = now.Add(30 * time.Second)
		} else if req.GetRestartPods() && !req.GetHold() {
			again, rerr := a.restartPods(ctx, req, now)
			if rerr != nil {
				a.log().Error("pods not restarted after the mesh CA changed", "namespace", req.GetNamespace(), "mesh", req.GetMesh(), "error", rerr)
				again = now.Add(30 * time.Second)
			}
			if !again.IsZero() && (renewAt.IsZero() || again.Before(renewAt)) {
				renewAt = again
			}
		}
		if !renewAt.IsZero() && (next.IsZero() || renewAt.Before(next)) {
			next = renewAt
		}
		results = append(results, r)
	}
	results = append(results, a.prune(ctx, wanted)...)
	return results, next
}

func (a *Agent) now() time.Time {
	if a.Clock != nil {
		return a.Clock()
	}
	return time.Now()
}

func (a *Agent) log() *slog.Logger {
	if a.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return a.Logger
}

// keep makes one mesh's cacerts match req; it returns the outcome and when
// to renew.
func (a *Agent) keep(ctx context.Context, req *relaypb.TrustRequest, sign SignFunc, now time.Time) (string, time.Time, error) {
	if req.GetNamespace() == "" || req.GetMesh() == "" {
		return "error", time.Time{}, errors.New("incomplete trust request (mesh and namespace are required)")
	}
	if !req.GetHold() && (req.GetIssuer() == "" || len(req.GetRootBundle()) == 0) {
		return "error", time.Time{}, errors.New("incomplete trust request (issuer and root bundle are required)")
	}
	secrets := a.Client.CoreV1().Secrets(req.GetNamespace())
	cur, err := secrets.Get(ctx, SecretName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cur = nil
	case err != nil:
		return "error", time.Time{}, fmt.Errorf("read %s/%s: %w", req.GetNamespace(), SecretName, err)
	case cur.Labels[outputs.OwnerLabel] != a.Owner:
		return "conflict", time.Time{}, fmt.Errorf("%s/%s exists and is not managed by Relaymesh (a CA someone plugged in by hand): left as it is", req.GetNamespace(), SecretName)
	}
	if req.GetHold() {
		// The server cannot load the root: keep what is there, as it is.
		if cur == nil {
			return "error", time.Time{}, errors.New("the server holds this mesh's CA (it cannot load the VirtualMesh's root) and there is none yet")
		}
		return "unchanged", time.Time{}, nil
	}
	if cur != nil {
		if renewAt, ok := current(cur, req, now); ok {
			return "unchanged", renewAt, nil
		}
	}
	key, csrPEM, err := newKey(req.GetKeyAlgorithm(), req.GetTrustDomain())
	if err != nil {
		return "error", time.Time{}, err
	}
	resp, err := sign(ctx, &relaypb.IntermediateRequest{Mesh: req.GetMesh(), Csr: csrPEM})
	if err != nil {
		return "error", time.Time{}, fmt.Errorf("sign intermediate: %w", err)
	}
	chain, err := checkResponse(resp, req, key.Public(), now)
	if err != nil {
		return "error", time.Time{}, fmt.Errorf("the server's intermediate was refused: %w", err)
	}
	cross, err := checkCross(resp, req, chain[0], now)
	if err != nil {
		return "error", time.Time{}, fmt.Errorf("the server's intermediate was refused: %w", err)
	}
	keyPEM, err := pemutil.Serialize(key)
	if err != nil {
		return "error", time.Time{}, errors.New("encode the intermediate key")
	}
	// cert-chain.pem: the intermediate and its issuing chain, then (a
	// CrossSigned rotation) the same intermediate from the other root and
	// its issuing chain, then the issuing root. istiod sends it all with
	// every certificate it issues.
	full := slices.Concat(chain[:len(chain)-1], cross, chain[len(chain)-1:])
	data := map[string][]byte{
		KeyCACert:   ca.CertsPEM(chain[0]),
		KeyCAKey:    pem.EncodeToMemory(keyPEM),
		KeyChain:    ca.CertsPEM(full...),
		KeyRootCert: resp.GetRootBundle(),
	}
	annotations := map[string]string{IssuerAnnotation: req.GetIssuer()}
	if req.GetCrossIssuer() != "" {
		annotations[CrossIssuerAnnotation] = req.GetCrossIssuer()
	}
	if cur == nil {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: SecretName, Namespace: req.GetNamespace(),
			Labels: map[string]string{outputs.OwnerLabel: a.Owner}, Annotations: annotations},
			Type: corev1.SecretTypeOpaque, Data: data}
		if _, err := secrets.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return "error", time.Time{}, fmt.Errorf("create %s/%s: %w", req.GetNamespace(), SecretName, err)
		}
	} else {
		next := cur.DeepCopy()
		next.Data = data
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		delete(next.Annotations, CrossIssuerAnnotation)
		maps.Copy(next.Annotations, annotations)
		// resourceVersion makes this fail rather than overwrite a change
		// made since it was read.
		if _, err := secrets.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
			return "error", time.Time{}, fmt.Errorf("update %s/%s: %w", req.GetNamespace(), SecretName, err)
		}
	}
	a.log().Info("mesh CA written", "namespace", req.GetNamespace(), "mesh", req.GetMesh(), "issuer", req.GetIssuer(),
		"cross_issuer", req.GetCrossIssuer(), "serial", chain[0].SerialNumber.Text(16), "not_after", chain[0].NotAfter)
	return "applied", renewalTime(chain[0], req), nil
}

// current reports whether cur already holds what req asks for, and when it
// must be renewed.
func current(cur *corev1.Secret, req *relaypb.TrustRequest, now time.Time) (time.Time, bool) {
	if !bytes.Equal(cur.Data[KeyRootCert], req.GetRootBundle()) || cur.Annotations[IssuerAnnotation] != req.GetIssuer() {
		return time.Time{}, false
	}
	certs, err := pemutil.ParseCertificateBundle(cur.Data[KeyChain])
	if err != nil || len(certs) == 0 {
		return time.Time{}, false
	}
	key, err := pemutil.ParseKey(cur.Data[KeyCAKey])
	if err != nil {
		return time.Time{}, false
	}
	signer, ok := key.(crypto.Signer)
	if !ok || !keyutil.Equal(signer.Public(), certs[0].PublicKey) {
		return time.Time{}, false
	}
	if _, err := verifyChain(certs, req, now); err != nil {
		return time.Time{}, false
	}
	// An intermediate of another (or no) trust domain is replaced.
	if checkConstraints(certs[0], req) != nil {
		return time.Time{}, false
	}
	// As is one without the second signature a CrossSigned step asks
	// for, or with one it no longer asks for.
	if cur.Annotations[CrossIssuerAnnotation] != req.GetCrossIssuer() {
		return time.Time{}, false
	}
	if req.GetCrossIssuer() != "" {
		root, err := crossRoot(req)
		if err != nil || !slices.ContainsFunc(certs[1:], func(c *x509.Certificate) bool {
			return keyutil.Equal(c.PublicKey, certs[0].PublicKey) && verifies(c, certs, []*x509.Certificate{root}, now) == nil
		}) {
			return time.Time{}, false
		}
	}
	renewAt := renewalTime(certs[0], req)
	if !now.Before(renewAt) {
		return time.Time{}, false
	}
	return renewAt, true
}

// checkResponse parses and verifies the server's answer: an intermediate CA
// for our key, chaining to the root req names, within the bundle req asked
// for.
func checkResponse(resp *relaypb.IntermediateResponse, req *relaypb.TrustRequest, pub crypto.PublicKey, now time.Time) ([]*x509.Certificate, error) {
	if len(resp.GetCertificateChain())+len(resp.GetCrossCertificateChain())+len(resp.GetRootBundle()) > maxSecretBytes {
		return nil, fmt.Errorf("answer larger than %d bytes", maxSecretBytes)
	}
	if !bytes.Equal(resp.GetRootBundle(), req.GetRootBundle()) || resp.GetIssuer() != req.GetIssuer() {
		return nil, errors.New("the answer names another root bundle or issuer than the request")
	}
	certs, err := pemutil.ParseCertificateBundle(resp.GetCertificateChain())
	if err != nil || len(certs) == 0 {
		return nil, errors.New("certificate chain is not PEM certificates")
	}
	if !keyutil.Equal(pub, certs[0].PublicKey) {
		return nil, errors.New("the intermediate is not for the key we generated")
	}
	if !certs[0].IsCA || !certs[0].BasicConstraintsValid || certs[0].MaxPathLen != 0 || !certs[0].MaxPathLenZero {
		return nil, errors.New("the intermediate is not a CA limited to path length 0")
	}
	if err := checkConstraints(certs[0], req); err != nil {
		return nil, err
	}
	return verifyChain(certs, req, now)
}

// checkCross checks the second signature a CrossSigned rotation's step
// asks for: the intermediate primary (the same subject, key identifier,
// key and constraints) signed by the root req.cross_root, which
// req.cross_issuer names. It returns that certificate and its issuing
// chain, nil when the request asks for none (and then the answer must
// carry none).
func checkCross(resp *relaypb.IntermediateResponse, req *relaypb.TrustRequest, primary *x509.Certificate, now time.Time) ([]*x509.Certificate, error) {
	raw := resp.GetCrossCertificateChain()
	if req.GetCrossIssuer() == "" {
		if len(raw) > 0 {
			return nil, errors.New("the answer carries a second signature the request did not ask for")
		}
		return nil, nil
	}
	if len(raw) == 0 {
		return nil, errors.New("the request asks for a second signature (a CrossSigned root rotation) and the answer carries none")
	}
	root, err := crossRoot(req)
	if err != nil {
		return nil, err
	}
	certs, err := pemutil.ParseCertificateBundle(raw)
	if err != nil || len(certs) == 0 {
		return nil, errors.New("the cross-signed intermediate is not PEM certificates")
	}
	c := certs[0]
	switch {
	case !keyutil.Equal(primary.PublicKey, c.PublicKey):
		return nil, errors.New("the cross-signed intermediate is not for the key we generated")
	case !bytes.Equal(c.RawSubject, primary.RawSubject) || !bytes.Equal(c.SubjectKeyId, primary.SubjectKeyId):
		return nil, errors.New("the cross-signed intermediate names another subject or key identifier than the intermediate: leaves would name only one of them")
	case !c.IsCA || !c.BasicConstraintsValid || c.MaxPathLen != 0 || !c.MaxPathLenZero:
		return nil, errors.New("the cross-signed intermediate is not a CA limited to path length 0")
	}
	if err := checkConstraints(c, req); err != nil {
		return nil, fmt.Errorf("the cross-signed intermediate: %w", err)
	}
	if err := verifies(c, certs[1:], []*x509.Certificate{root}, now); err != nil {
		return nil, fmt.Errorf("the cross-signed intermediate does not chain to the root the request names: %w", err)
	}
	return certs, nil
}

// crossRoot is the root req.cross_root carries, checked against
// req.cross_issuer.
func crossRoot(req *relaypb.TrustRequest) (*x509.Certificate, error) {
	roots, err := pemutil.ParseCertificateBundle(req.GetCrossRoot())
	switch {
	case err != nil || len(roots) != 1:
		return nil, errors.New("the request's cross root is not one PEM certificate")
	case Fingerprint(roots[0]) != req.GetCrossIssuer():
		return nil, errors.New("the request's cross root is not the root its cross issuer names")
	case req.GetCrossIssuer() == req.GetIssuer():
		return nil, errors.New("the request names its issuer as its cross issuer")
	}
	return roots[0], nil
}

// checkConstraints requires the intermediate to be constrained to the
// trust domain the request names: URIs of exactly that host, critical. A
// request without one (an older server) asks nothing of the constraints.
func checkConstraints(c *x509.Certificate, req *relaypb.TrustRequest) error {
	td := req.GetTrustDomain()
	if td == "" {
		return nil
	}
	if !slices.Equal(c.PermittedURIDomains, []string{td}) || !slices.Equal(c.ExcludedURIDomains, []string{"." + td}) || !c.PermittedDNSDomainsCritical ||
		len(c.PermittedDNSDomains)+len(c.ExcludedDNSDomains)+len(c.PermittedIPRanges)+len(c.ExcludedIPRanges)+len(c.PermittedEmailAddresses)+len(c.ExcludedEmailAddresses) != 0 {
		return fmt.Errorf("the intermediate is not constrained to trust domain %q (it permits URIs of %q)", td, c.PermittedURIDomains)
	}
	return nil
}

// verifyChain checks that chain verifies to the root named by req.issuer,
// which must be in req's bundle, and returns the chain up to that root.
func verifyChain(chain []*x509.Certificate, req *relaypb.TrustRequest, now time.Time) ([]*x509.Certificate, error) {
	roots, err := pemutil.ParseCertificateBundle(req.GetRootBundle())
	if err != nil || len(roots) == 0 {
		return nil, errors.New("root bundle is not PEM certificates")
	}
	idx := slices.IndexFunc(roots, func(c *x509.Certificate) bool { return Fingerprint(c) == req.GetIssuer() })
	if idx < 0 {
		return nil, errors.New("the issuer is not in the root bundle")
	}
	if err := verifies(chain[0], chain[1:], roots[idx:idx+1], now); err != nil {
		return nil, fmt.Errorf("does not chain to the requested root: %w", err)
	}
	// cert-chain.pem ends in the issuing root only: root-cert.pem carries
	// the others.
	if !chain[len(chain)-1].Equal(roots[idx]) {
		chain = append(slices.Clone(chain), roots[idx])
	}
	return chain, nil
}

// verifies checks that cert, through the CA certificates of chain, verifies
// to one of roots at now.
func verifies(cert *x509.Certificate, chain, roots []*x509.Certificate, now time.Time) error {
	rootPool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		rootPool.AddCert(r)
	}
	for _, c := range chain {
		if !c.Equal(cert) {
			inter.AddCert(c)
		}
	}
	_, err := cert.Verify(x509.VerifyOptions{Roots: rootPool, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

func renewalTime(c *x509.Certificate, req *relaypb.TrustRequest) time.Time {
	pct := req.GetRenewAtPercent()
	if pct < 10 || pct > 90 {
		pct = defaultRenewAtPercent
	}
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotBefore.Add(life * time.Duration(pct) / 100)
}

// newKey generates the intermediate's key and its CSR, which asks for the
// name constraints of trust domain td when td is set.
func newKey(alg, td string) (crypto.Signer, []byte, error) {
	var (
		k   any
		err error
	)
	switch alg {
	case "", "ECDSAP256":
		k, err = keyutil.GenerateKey("EC", "P-256", 0)
	case "ECDSAP384":
		k, err = keyutil.GenerateKey("EC", "P-384", 0)
	case "RSA3072":
		k, err = keyutil.GenerateKey("RSA", "", 3072)
	case "RSA4096":
		k, err = keyutil.GenerateKey("RSA", "", 4096)
	default:
		return nil, nil, fmt.Errorf("key algorithm %q is not one of ECDSAP256, ECDSAP384, RSA3072, RSA4096", alg)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, nil, errors.New("generated key cannot sign")
	}
	// No subject and no names: the server decides the whole certificate.
	// The name constraints it will set are asked for, for CAs that take
	// them only from the request.
	tmpl := &x509.CertificateRequest{}
	if td != "" {
		ext, err := ca.NameConstraintsRequest(td)
		if err != nil {
			return nil, nil, fmt.Errorf("certificate request: %w", err)
		}
		tmpl.ExtraExtensions = []pkix.Extension{ext}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, signer)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate request: %w", err)
	}
	return signer, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// prune deletes the cacerts Secrets this agent manages in namespaces no
// longer asked for.
func (a *Agent) prune(ctx context.Context, wanted map[string]bool) []*relaypb.ObjectResult {
	list, err := a.Client.CoreV1().Secrets("").List(ctx, metav1.ListOptions{
		LabelSelector: outputs.OwnerLabel + "=" + a.Owner, FieldSelector: "metadata.name=" + SecretName})
	if err != nil {
		return []*relaypb.ObjectResult{{ApiVersion: "v1", Kind: "Secret", Name: SecretName, Outcome: "error", Error: "list managed cacerts: " + err.Error()}}
	}
	var out []*relaypb.ObjectResult
	for _, s := range list.Items {
		if wanted[s.Namespace] {
			continue
		}
		r := &relaypb.ObjectResult{ApiVersion: "v1", Kind: "Secret", Namespace: s.Namespace, Name: SecretName, Outcome: "pruned"}
		uid := s.UID
		if err := a.Client.CoreV1().Secrets(s.Namespace).Delete(ctx, SecretName, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
			r.Outcome, r.Error = "error", err.Error()
		}
		out = append(out, r)
	}
	return out
}

// Fingerprint is the hex SHA-256 of a certificate's DER.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}
