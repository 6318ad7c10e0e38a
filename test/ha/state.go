package ha

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server/heads"
	"github.com/relaymesh/relaymesh/server/leader"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServerLease is the Lease the replicas elect the holder of the once-only
// work with (docs/design/2026-11-25-high-availability.md).
const ServerLease = "relaymesh-server"

// LeaseHolder reads the holderIdentity of the server's Lease ("" when none
// holds it).
func (e *Env) LeaseHolder(ctx context.Context) (string, error) {
	l, err := e.Kube.CoordinationV1().Leases(e.Namespace).Get(ctx, ServerLease, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if l.Spec.HolderIdentity == nil {
		return "", nil
	}
	return *l.Spec.HolderIdentity, nil
}

// LeaseDuration reads how long the server's Lease lasts without renewal:
// a dead holder is replaced after about that long.
func (e *Env) LeaseDuration(ctx context.Context) (time.Duration, error) {
	return e.leaseDuration(ctx, ServerLease)
}

// ReplicaLeaseDuration reads how long replica's own Lease lasts without
// renewal: a replica cut off from the apiserver that long ends its
// sessions and refuses calls, and the leader counts it gone.
func (e *Env) ReplicaLeaseDuration(ctx context.Context, replica string) (time.Duration, error) {
	return e.leaseDuration(ctx, leader.ReplicaLeaseName(replica))
}

func (e *Env) leaseDuration(ctx context.Context, name string) (time.Duration, error) {
	l, err := e.Kube.CoordinationV1().Leases(e.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	if l.Spec.LeaseDurationSeconds == nil {
		return 0, fmt.Errorf("lease %s has no duration", name)
	}
	return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second, nil
}

// ReplicaNamed returns the replica whose --replica-name is name, or nil.
func (e *Env) ReplicaNamed(name string) *Replica {
	for _, r := range e.Replicas {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// ReplicaAt returns the replica whose relay address is addr, or nil.
func (e *Env) ReplicaAt(addr string) *Replica {
	for _, r := range e.Replicas {
		if r.RelayAddr == addr {
			return r
		}
	}
	return nil
}

// Heads reads every cluster's output head version from the heads'
// ConfigMaps (each entry "VERSION DIGEST").
func (e *Env) Heads(ctx context.Context) (map[string]uint64, error) {
	list, err := e.Kube.CoreV1().ConfigMaps(e.Namespace).List(ctx, metav1.ListOptions{LabelSelector: heads.Label + "=true"})
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, cm := range list.Items {
		for cluster, v := range cm.Data {
			n, _, _ := strings.Cut(v, " ")
			version, err := strconv.ParseUint(n, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("output head of %s in %s: %q: %w", cluster, cm.Name, v, err)
			}
			out[cluster] = version
		}
	}
	return out, nil
}

// RestartStore restarts the management cluster's kube-apiserver, and with
// withEtcd the etcd under it (SIGKILL, then the same flags and data), and
// returns how long the apiserver was unreachable.
func (e *Env) RestartStore(ctx context.Context, withEtcd bool) (time.Duration, error) {
	return e.Local.Restart(ctx, e.Mgmt.Name, withEtcd)
}

// AppliedVersions are the versions of the output sets the agent logged as
// applied ("output set applied"), in the order it applied them, and how
// many sets it logged as older than the one it had applied and skipped.
func (a *Agent) AppliedVersions() (applied []uint64, skipped int, err error) {
	b, err := os.ReadFile(a.Proc.LogPath())
	if err != nil {
		return nil, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("{")) {
			continue
		}
		var rec struct {
			Msg     string      `json:"msg"`
			Version json.Number `json:"version"`
		}
		d := json.NewDecoder(bytes.NewReader(line))
		d.UseNumber() // versions exceed what a float64 keeps exactly
		if d.Decode(&rec) != nil {
			continue
		}
		switch {
		case rec.Msg == "output set applied":
			v, err := strconv.ParseUint(rec.Version.String(), 10, 64)
			if err != nil {
				return nil, 0, fmt.Errorf("%s: version %q: %w", a.Name, rec.Version, err)
			}
			applied = append(applied, v)
		case strings.HasPrefix(rec.Msg, "output set older than"):
			skipped++
		}
	}
	return applied, skipped, sc.Err()
}

// BootstrapKeyPair presents token for cluster with a CSR for a fresh key
// and returns the certificate chain and that key (PEM), for later mTLS
// calls (Dial with CertPEM and KeyPEM). The key is a secret: never log it.
func (c *Client) BootstrapKeyPair(ctx context.Context, cluster, token string) (chainPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, nil, err
	}
	csr := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	resp, err := relaypb.NewIdentityClient(c.conn).Bootstrap(ctx, &relaypb.BootstrapRequest{Cluster: cluster, Token: token, Csr: csr, AgentVersion: "test/ha"})
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return resp.GetCertificateChain(), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}
