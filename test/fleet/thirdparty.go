package fleet

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/cfsslca"
	"github.com/relaymesh/relaymesh/ca/stepca"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"go.step.sm/crypto/jose"
	"go.step.sm/crypto/pemutil"
)

// ExternalCA is a third-party CA server the issuance comparison runs
// (`cfssl serve` or step-ca), with the project's back-end client for it.
type ExternalCA struct {
	Name string
	// Signer is the project's client for it (ca/cfsslca or ca/stepca).
	Signer ca.RequestSigner
	proc   *localcluster.Process
}

// Pid is the CA server's process id.
func (e *ExternalCA) Pid() int { return e.proc.Pid() }

// Stop ends the CA server.
func (e *ExternalCA) Stop() error { return e.proc.Stop(10 * time.Second) }

// caMaterial is a CA written to files for a third-party server.
type caMaterial struct {
	issuerPEM, rootPEM            []byte
	issuerPath, keyPath, rootPath string
}

// caFiles writes a fresh relay-style CA (root and issuing CA, ECDSA P-256)
// into dir.
func caFiles(dir, org string) (*caMaterial, error) {
	rc, err := ca.GenerateRelayCA(ca.GenerateConfig{Org: org})
	if err != nil {
		return nil, err
	}
	block, err := pemutil.Serialize(rc.IssuerKey)
	if err != nil {
		return nil, err
	}
	m := &caMaterial{
		issuerPEM: ca.CertsPEM(rc.Issuer), rootPEM: ca.CertsPEM(rc.Root),
		issuerPath: filepath.Join(dir, "issuer.pem"), keyPath: filepath.Join(dir, "issuer-key.pem"), rootPath: filepath.Join(dir, "root.pem"),
	}
	for p, b := range map[string][]byte{m.issuerPath: m.issuerPEM, m.keyPath: pem.EncodeToMemory(block), m.rootPath: m.rootPEM} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// cfsslProfile is a cfssl signing profile as its config file spells it.
type cfsslProfile struct {
	Usages       []string        `json:"usages"`
	Expiry       string          `json:"expiry"`
	Backdate     string          `json:"backdate"`
	AuthKey      string          `json:"auth_key"`
	CSRWhitelist map[string]bool `json:"CSRWhitelist"`
}

// StartCfssl runs `cfssl serve` (bin) with the profiles ca/cfsslca needs,
// a fresh CA and an HMAC auth key, on a private loopback address, and returns it
// with a connected client.
func StartCfssl(ctx context.Context, bin, dir string) (*ExternalCA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	m, err := caFiles(dir, "fleet cfssl")
	if err != nil {
		return nil, err
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	keyHex := hex.EncodeToString(key)
	keyFile := filepath.Join(dir, "auth.key")
	if err := os.WriteFile(keyFile, []byte(keyHex+"\n"), 0o600); err != nil {
		return nil, err
	}
	whitelist := map[string]bool{"PublicKey": true, "PublicKeyAlgorithm": true}
	prof := func(expiry string, usages ...string) cfsslProfile {
		return cfsslProfile{Usages: usages, Expiry: expiry, Backdate: "1m", AuthKey: "relaymesh", CSRWhitelist: whitelist}
	}
	conf, err := json.MarshalIndent(map[string]any{
		"signing": map[string]any{
			"default": prof("1h", "digital signature", "client auth"),
			"profiles": map[string]cfsslProfile{
				"relaymesh-client":     prof("24h", "digital signature", "client auth"),
				"relaymesh-server":     prof("720h", "digital signature", "server auth"),
				"relaymesh-server-rsa": prof("720h", "digital signature", "key encipherment", "server auth"),
			},
		},
		"auth_keys": map[string]any{"relaymesh": map[string]string{"type": "standard", "key": "file:" + keyFile}},
	}, "", "  ")
	if err != nil {
		return nil, err
	}
	confFile := filepath.Join(dir, "config.json")
	if err := os.WriteFile(confFile, conf, 0o600); err != nil {
		return nil, err
	}
	proc, url, err := startHealthy("cfssl", dir, func(host, port string) []string {
		return []string{bin, "serve", "-address", host, "-port", port, "-ca", m.issuerPath, "-ca-key", m.keyPath, "-config", confFile, "-loglevel", "1"}
	}, "http", "/api/v1/cfssl/health", nil)
	if err != nil {
		return nil, err
	}
	s, err := cfsslca.New(ctx, cfsslca.Config{URL: url, AuthKey: []byte(keyHex), ChainPEM: m.issuerPEM, RootsPEM: m.rootPEM})
	if err != nil {
		_ = proc.Stop(5 * time.Second)
		return nil, err
	}
	return asExternal("cfssl", s, proc)
}

// StartStepCA runs step-ca (bin) with a JWK provisioner using
// stepca.ProvisionerTemplate and a fresh CA on a private loopback address. db is
// "" for no database (used token ids kept in memory) or a nosql type such as
// "badgerv2" (what `step ca init` configures), kept in dir.
func StartStepCA(ctx context.Context, bin, dir, db string) (*ExternalCA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	m, err := caFiles(dir, "fleet step-ca")
	if err != nil {
		return nil, err
	}
	jwk, err := jose.GenerateJWK("EC", "P-256", "ES256", "sig", "", 0)
	if err != nil {
		return nil, err
	}
	priv, err := json.Marshal(jwk)
	if err != nil {
		return nil, err
	}
	pub := jwk.Public()
	var dbConf any
	if db != "" {
		dbConf = map[string]string{"type": db, "dataSource": filepath.Join(dir, "db")}
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(m.rootPEM)
	name := "step-ca"
	if db != "" {
		name += "-" + db
	}
	proc, url, err := startHealthy(name, dir, func(host, port string) []string {
		conf, _ := json.MarshalIndent(map[string]any{
			"root": m.rootPath, "crt": m.issuerPath, "key": m.keyPath,
			"address": net.JoinHostPort(host, port), "dnsNames": []string{host},
			"logger": map[string]string{"format": "text"}, "db": dbConf,
			"authority": map[string]any{"provisioners": []map[string]any{{
				"type": "JWK", "name": "relaymesh", "key": &pub,
				"claims": map[string]any{"minTLSCertDuration": "5s", "maxTLSCertDuration": "8760h", "defaultTLSCertDuration": "24h",
					"disableRenewal": true, "disableSmallstepExtensions": true},
				"options": map[string]any{"x509": map[string]any{"template": stepca.ProvisionerTemplate}},
			}}},
			"tls": map[string]any{"minVersion": 1.2, "maxVersion": 1.3},
		}, "", "  ")
		confFile := filepath.Join(dir, "ca.json")
		_ = os.WriteFile(confFile, conf, 0o600)
		return []string{bin, confFile}
	}, "https", "/health", roots)
	if err != nil {
		return nil, err
	}
	s, err := stepca.New(ctx, stepca.Config{URL: url, Provisioner: "relaymesh", ProvisionerKey: priv, ChainPEM: m.issuerPEM, RootsPEM: m.rootPEM})
	if err != nil {
		_ = proc.Stop(5 * time.Second)
		return nil, err
	}
	return asExternal(name, s, proc)
}

func asExternal(name string, s ca.Signer, proc *localcluster.Process) (*ExternalCA, error) {
	rs, ok := s.(ca.RequestSigner)
	if !ok {
		_ = proc.Stop(5 * time.Second)
		return nil, fmt.Errorf("%s: the client is not a request signer", name)
	}
	return &ExternalCA{Name: name, Signer: rs, proc: proc}, nil
}

// startHealthy starts a server on a port of a private loopback address
// (localcluster.ListenAddr: command gives its command line for host and
// port) and waits until path answers 200 OK; a server that does not come
// up is tried again on a fresh address, three times in all.
func startHealthy(name, dir string, command func(host, port string) []string, scheme, path string, roots *x509.CertPool) (*localcluster.Process, string, error) {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer hc.CloseIdleConnections()
	var last error
	for attempt := 1; attempt <= 3; attempt++ {
		addr, err := localcluster.ListenAddr()
		if err != nil {
			return nil, "", err
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, "", err
		}
		cmd := command(host, port)
		proc, err := localcluster.StartProcess(name, cmd[0], cmd[1:], filepath.Join(dir, name+".log"), false)
		if err != nil {
			return nil, "", err
		}
		url := scheme + "://" + addr
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if done, err := proc.Exited(); done {
				last = fmt.Errorf("%s exited: %v (see %s)", name, err, proc.LogPath())
				break
			}
			resp, err := hc.Get(url + path)
			if err != nil {
				last = err
				continue
			}
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return proc, url, nil
			}
		}
		_ = proc.Stop(5 * time.Second)
	}
	return nil, "", errors.Join(fmt.Errorf("%s did not come up", name), last)
}
