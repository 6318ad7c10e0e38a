package localcluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"
)

// Creating the CRDs through each new API server is a large share of what a
// cluster's start costs, and a test process starts many clusters with the
// same CRDs: the API server's create, naming and establishing of each one,
// and its managed fields, are the same work every time (2026-12-07, a
// quiet machine, nine later three-cluster starts each way, alternated: a
// median 19.5 CPU-s with the CRDs created, 16.1 with them seeded as
// below). So the first cluster a process starts keeps what its API
// server stored of the CRDs in etcd, once they are established, and the
// clusters started after it get those records written under their own
// etcd prefix before their API servers start: the API server loads them
// as it would after a restart, serving them established. installCRDs
// still runs after every start and creates whatever a seed did not hold
// (only those: creating one the API server has is refused only after it
// decoded and validated the whole CRD), so a failed or partial seed costs
// time, never CRDs.

// crdKeys is where an API server keeps CRDs, below its --etcd-prefix.
const crdKeys = "/apiextensions.k8s.io/customresourcedefinitions/"

// crdSeed is the CRD records of this process's first cluster of each
// kube-apiserver build (Config.BinDir), by key below its prefix: records
// are copied only between API servers of one build.
var crdSeed struct {
	sync.Mutex
	records map[string]map[string][]byte
}

// etcdPrefix is the --etcd-prefix of the named cluster's API server.
func etcdPrefix(cluster string) string { return "/registry/" + cluster }

// seedCRDs writes the CRD records kept for the API servers in binDir under
// each cluster's prefix; it reports whether there were any to write. An
// error leaves the clusters to installCRDs.
func seedCRDs(ctx context.Context, etcd *etcdTLS, binDir string, clusters []string) (bool, error) {
	crdSeed.Lock()
	records := crdSeed.records[binDir]
	crdSeed.Unlock()
	if len(records) == 0 {
		return false, nil
	}
	kv, err := newEtcdKV(etcd)
	if err != nil {
		return false, err
	}
	defer kv.close()
	for _, c := range clusters {
		for key, value := range records {
			if err := kv.put(ctx, etcdPrefix(c)+crdKeys+key, value); err != nil {
				return false, fmt.Errorf("seed the CRDs of cluster %s: %w", c, err)
			}
		}
	}
	return true, nil
}

// keepCRDs takes the CRD records of cluster, whose API server (from
// binDir) established every CRD, as the seed of the clusters this process
// starts later; want is how many there are (fewer read: none kept).
func keepCRDs(ctx context.Context, etcd *etcdTLS, binDir, cluster string, want int) error {
	crdSeed.Lock()
	kept := crdSeed.records[binDir] != nil
	crdSeed.Unlock()
	if kept {
		return nil
	}
	kv, err := newEtcdKV(etcd)
	if err != nil {
		return err
	}
	defer kv.close()
	prefix := etcdPrefix(cluster) + crdKeys
	read, err := kv.rangePrefix(ctx, prefix)
	if err != nil {
		return fmt.Errorf("read the CRDs of cluster %s: %w", cluster, err)
	}
	if len(read) != want {
		return fmt.Errorf("etcd holds %d CRD records of cluster %s, not %d", len(read), cluster, want)
	}
	records := make(map[string][]byte, len(read))
	for key, value := range read {
		records[key[len(prefix):]] = value
	}
	crdSeed.Lock()
	defer crdSeed.Unlock()
	if crdSeed.records == nil {
		crdSeed.records = map[string]map[string][]byte{}
	}
	if crdSeed.records[binDir] == nil {
		crdSeed.records[binDir] = records
	}
	return nil
}

// etcdKV reads and writes etcd keys through its JSON gateway (the v3 API
// over HTTP, served on the client URL), as the API server's client.
type etcdKV struct {
	url    string
	client *http.Client
}

func newEtcdKV(etcd *etcdTLS) (*etcdKV, error) {
	cert, err := tls.LoadX509KeyPair(etcd.certFile, etcd.keyFile)
	if err != nil {
		return nil, fmt.Errorf("etcd client certificate: %w", err)
	}
	caPEM, err := os.ReadFile(etcd.caFile)
	if err != nil {
		return nil, fmt.Errorf("etcd CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in %s", etcd.caFile)
	}
	return &etcdKV{url: etcd.url, client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{cert}}}}}, nil
}

// close drops the client's idle connections to etcd.
func (k *etcdKV) close() { k.client.CloseIdleConnections() }

// call posts req as JSON to the gateway's path and decodes the answer
// into resp.
func (k *etcdKV) call(ctx context.Context, path string, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, k.url+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	r.Header.Set("Content-Type", "application/json")
	res, err := k.client.Do(r)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %.200s", path, res.Status, b)
	}
	return json.Unmarshal(b, resp)
}

// put writes key. Keys and values are bytes ([]byte: base64 in JSON, as
// the gateway wants them).
func (k *etcdKV) put(ctx context.Context, key string, value []byte) error {
	return k.call(ctx, "/v3/kv/put", struct {
		Key   []byte `json:"key"`
		Value []byte `json:"value"`
	}{[]byte(key), value}, &struct{}{})
}

// rangePrefix reads every key that starts with prefix.
func (k *etcdKV) rangePrefix(ctx context.Context, prefix string) (map[string][]byte, error) {
	end := []byte(prefix)
	end[len(end)-1]++ // prefix ends in '/': no carry
	var resp struct {
		KVs []struct {
			Key   []byte `json:"key"`
			Value []byte `json:"value"`
		} `json:"kvs"`
	}
	if err := k.call(ctx, "/v3/kv/range", struct {
		Key      []byte `json:"key"`
		RangeEnd []byte `json:"range_end"`
	}{[]byte(prefix), end}, &resp); err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(resp.KVs))
	for _, kv := range resp.KVs {
		out[string(kv.Key)] = kv.Value
	}
	return out, nil
}
