package catest

import (
	"cmp"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// CFSSL is a running `cfssl serve` and what a cfsslca.Config needs to use
// it: its URL, the files of its signing CA's chain and roots, its auth key
// (hex, and a file holding it) and, with HTTPS, the roots of its TLS
// certificate.
type CFSSL struct {
	URL                              string
	ChainFile, RootsFile, AuthKeyHex string
	AuthKeyFile                      string
	TLSRootsFile                     string
	Issuing                          *CA
	Proc                             *Process
}

// CFSSLOptions shape a test cfssl.
type CFSSLOptions struct {
	// caTTL is the signing CA's remaining lifetime; default a year.
	CATTL time.Duration
	// https serves TLS with a certificate from a root of its own.
	HTTPS bool
	// clientUsages overrides the usages of the relaymesh-client profile.
	ClientUsages []string
	// intermediateUsages overrides the usages of the
	// relaymesh-intermediate profile.
	IntermediateUsages []string
	// noNameConstraints leaves the name constraints extension out of the
	// intermediate profile's allowed_extensions.
	NoNameConstraints bool
	// noCAConstraint leaves ca_constraint out of the intermediate profile.
	NoCAConstraint bool
	// IssuingPathLenZero gives the signing CA pathLen 0 (it may then sign
	// no CA; cfssl does not check that itself).
	IssuingPathLenZero bool
	// root signs the signing CA instead of a fresh root (a renewal under
	// the same root).
	Root *CA
	// ClientExpiry is the relaymesh-client profile's expiry (the
	// Authority's agent certificate lifetime); default "24h".
	ClientExpiry string
}

// profile is a cfssl signing profile as its config file spells it.
type profile struct {
	Usages       []string        `json:"usages"`
	Expiry       string          `json:"expiry"`
	Backdate     string          `json:"backdate"`
	AuthKey      string          `json:"auth_key"`
	CSRWhitelist map[string]bool `json:"CSRWhitelist,omitempty"`
	CAConstraint *caConstraint   `json:"ca_constraint,omitempty"`
	// CopyExtensions copies the extensions of the certificate request: the
	// intermediates' name constraints.
	CopyExtensions bool `json:"copy_extensions,omitempty"`
}

// caConstraint is a profile's ca_constraint.
type caConstraint struct {
	IsCA           bool `json:"is_ca"`
	MaxPathLen     int  `json:"max_path_len"`
	MaxPathLenZero bool `json:"max_path_len_zero"`
}

// StartCFSSL starts `cfssl serve` on a free loopback port with a fresh
// CA and an auth key, and waits until it answers.
func StartCFSSL(t testing.TB, o CFSSLOptions) *CFSSL {
	t.Helper()
	bin := Binary(t, "cfssl")
	dir := t.TempDir()
	// Two years: cfssl does not clamp to its CA, so the CA must outlive a
	// one-year intermediate. pathLen 1 leaves room for one.
	twoYears := time.Now().Add(2 * 365 * 24 * time.Hour)
	root := o.Root
	if root == nil {
		root = NewRoot(t, CAOptions{Name: "cfssl test root", NotAfter: twoYears})
	}
	caOpts := CAOptions{Name: "cfssl test signing CA", MaxPathLen: 1, NotAfter: twoYears}
	if o.IssuingPathLenZero {
		caOpts.MaxPathLen, caOpts.PathLenZero = 0, true
	}
	if o.CATTL != 0 {
		caOpts.NotAfter = time.Now().Add(o.CATTL)
	}
	issuing := root.NewIntermediate(t, caOpts)
	s := &CFSSL{Issuing: issuing}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}
	key := make([]byte, 32)
	_, err := rand.Read(key)
	require.NoError(t, err)
	s.AuthKeyHex = hex.EncodeToString(key)
	s.AuthKeyFile = write("auth.key", []byte(s.AuthKeyHex+"\n"))
	s.ChainFile = write("chain.pem", issuing.ChainPEM())
	s.RootsFile = write("roots.pem", issuing.RootsPEM())
	caFile := write("ca.pem", CertsPEM(issuing.Cert))
	caKeyFile := write("ca-key.pem", issuing.KeyPEM(t))

	// Only the public key may come from the CSR; the request carries
	// subject and hosts. Expiries are the Authority's default TTLs.
	whitelist := map[string]bool{"PublicKey": true, "PublicKeyAlgorithm": true}
	prof := func(expiry string, usages ...string) profile {
		return profile{Usages: usages, Expiry: expiry, Backdate: "1m", AuthKey: "relaymesh", CSRWhitelist: whitelist}
	}
	clientUsages := []string{"digital signature", "client auth"}
	if o.ClientUsages != nil {
		clientUsages = o.ClientUsages
	}
	intermediateUsages := []string{"cert sign", "crl sign"}
	if o.IntermediateUsages != nil {
		intermediateUsages = o.IntermediateUsages
	}
	// The Authority's default intermediate TTL: a year.
	intermediate := prof("8760h", intermediateUsages...)
	if !o.NoCAConstraint {
		intermediate.CAConstraint = &caConstraint{IsCA: true, MaxPathLen: 0, MaxPathLenZero: true}
	}
	if !o.NoNameConstraints {
		// cfssl's sign API takes no extensions, and a CSRWhitelist drops
		// those it copies from the request: the intermediate's name
		// constraints come from the agent's request. The Authority still
		// requires the result to be exactly its template.
		intermediate.CopyExtensions, intermediate.CSRWhitelist = true, nil
	}
	cfg := map[string]any{
		"signing": map[string]any{
			"default": prof("1h", "digital signature", "client auth"),
			"profiles": map[string]profile{
				"relaymesh-client":       prof(cmp.Or(o.ClientExpiry, "24h"), clientUsages...),
				"relaymesh-server":       prof("720h", "digital signature", "server auth"),
				"relaymesh-server-rsa":   prof("720h", "digital signature", "key encipherment", "server auth"),
				"relaymesh-intermediate": intermediate,
			},
		},
		// cfssl reads the key from the file: it is in no command line.
		"auth_keys": map[string]any{"relaymesh": map[string]string{"type": "standard", "key": "file:" + s.AuthKeyFile}},
	}
	cfgJSON, err := json.MarshalIndent(cfg, "", "  ")
	require.NoError(t, err)
	cfgFile := write("config.json", cfgJSON)

	scheme := "http"
	var tlsArgs []string
	var tlsPool *x509.CertPool
	if o.HTTPS {
		scheme = "https"
		tlsRoot := NewRoot(t, CAOptions{Name: "cfssl TLS root"})
		tlsKey := NewKey(t, ECDSAP256)
		now := time.Now()
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
			SerialNumber: big.NewInt(now.UnixNano()),
			Subject:      pkix.Name{CommonName: "cfssl test server"},
			NotBefore:    now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}, tlsRoot.Cert, tlsKey.Public(), tlsRoot.Key)
		require.NoError(t, err)
		c, err := x509.ParseCertificate(der)
		require.NoError(t, err)
		tlsArgs = []string{"-tls-cert", write("tls.pem", CertsPEM(c)), "-tls-key", write("tls-key.pem", KeyPEM(t, tlsKey))}
		s.TLSRootsFile = write("tls-roots.pem", CertsPEM(tlsRoot.Cert))
		tlsPool = x509.NewCertPool()
		tlsPool.AddCert(tlsRoot.Cert)
	}
	s.Proc, s.URL = StartServer(t, Server{
		Name: "cfssl", Bin: bin, Dir: dir, Scheme: scheme, Health: "/api/v1/cfssl/health", Roots: tlsPool, Timeout: 20 * time.Second,
		Args: func(addr string) []string {
			host, port, err := net.SplitHostPort(addr)
			require.NoError(t, err)
			return append([]string{"serve", "-address", host, "-port", port, "-ca", caFile, "-ca-key", caKeyFile, "-config", cfgFile, "-loglevel", "1"}, tlsArgs...)
		},
	})
	return s
}
