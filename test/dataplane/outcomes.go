package dataplane

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
)

// Outcomes counts what a batch of RPCs came to: every RPC by status code,
// and every answered one by the workload, subset (version label), cluster
// and seen peer identity of the answer. It is safe for concurrent use.
type Outcomes struct {
	mu        sync.Mutex
	total     int
	codes     map[codes.Code]int
	workloads map[string]int
	versions  map[string]int
	clusters  map[string]int
	peers     map[string]int
	issuers   map[string]int // of the callers' certificates, as servers saw them
	servers   map[string]int // of the servers' certificates, as the client saw them
	errors    map[string]int
	elapsed   time.Duration
}

// maxDistinctErrors bounds how many different error messages are kept.
const maxDistinctErrors = 8

// NewOutcomes returns empty counts.
func NewOutcomes() *Outcomes {
	return &Outcomes{
		codes: map[codes.Code]int{}, workloads: map[string]int{}, versions: map[string]int{},
		clusters: map[string]int{}, peers: map[string]int{}, issuers: map[string]int{}, servers: map[string]int{}, errors: map[string]int{},
	}
}

// Add counts one RPC: its code, and for OK its reply; for errors a sample
// of the message (the first few distinct ones).
func (o *Outcomes) Add(code codes.Code, r Reply, errMsg string) { o.add(code, r, "", errMsg) }

// add is Add with the issuer of the server's certificate ("" over
// plaintext).
func (o *Outcomes) add(code codes.Code, r Reply, serverIssuer, errMsg string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.total++
	o.codes[code]++
	if code == codes.OK {
		o.workloads[r.Workload]++
		o.versions[r.Version]++
		o.clusters[r.Cluster]++
		o.peers[r.Peer]++
		if r.PeerIssuer != "" {
			o.issuers[r.PeerIssuer]++
		}
		if serverIssuer != "" {
			o.servers[serverIssuer]++
		}
		return
	}
	key := fmt.Sprintf("%s: %.600s", code, errMsg)
	if _, ok := o.errors[key]; ok || len(o.errors) < maxDistinctErrors {
		o.errors[key]++
	}
}

// Total is the number of RPCs counted.
func (o *Outcomes) Total() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.total
}

// Code is how many RPCs ended with c.
func (o *Outcomes) Code(c codes.Code) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.codes[c]
}

// Failed is how many RPCs did not end OK.
func (o *Outcomes) Failed() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.total - o.codes[codes.OK]
}

// Workload is how many RPCs the named workload answered.
func (o *Outcomes) Workload(name string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.workloads[name]
}

// Version is how many RPCs workloads of the subset version answered.
func (o *Outcomes) Version(v string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.versions[v]
}

// Cluster is how many RPCs workloads of the cluster answered.
func (o *Outcomes) Cluster(name string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.clusters[name]
}

// Peer is how many answered RPCs the server saw come from the identity id
// ("" counts plaintext calls).
func (o *Outcomes) Peer(id string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.peers[id]
}

// PeerIssuer is how many answered RPCs came with a client certificate
// issued by the CA id (KeyID), as the server saw it.
func (o *Outcomes) PeerIssuer(id string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.issuers[id]
}

// ServerIssuer is how many answered RPCs were served with a certificate
// issued by the CA id (KeyID), as the client saw it.
func (o *Outcomes) ServerIssuer(id string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.servers[id]
}

// Merge adds other's counts to o.
func (o *Outcomes) Merge(other *Outcomes) {
	other.mu.Lock()
	defer other.mu.Unlock()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.total += other.total
	for k, v := range other.codes {
		o.codes[k] += v
	}
	for _, m := range []struct{ to, from map[string]int }{
		{o.workloads, other.workloads}, {o.versions, other.versions}, {o.clusters, other.clusters},
		{o.peers, other.peers}, {o.issuers, other.issuers}, {o.servers, other.servers},
	} {
		for k, v := range m.from {
			m.to[k] += v
		}
	}
	for k, v := range other.errors {
		if _, ok := o.errors[k]; ok || len(o.errors) < maxDistinctErrors {
			o.errors[k] += v
		}
	}
}

// ErrorsWith is how many failed RPCs had an error message containing
// substr (among the first few distinct messages Add keeps).
func (o *Outcomes) ErrorsWith(substr string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for k, c := range o.errors {
		if strings.Contains(k, substr) {
			n += c
		}
	}
	return n
}

// Percent is 100*n/Total, 0 for no RPCs.
func (o *Outcomes) Percent(n int) float64 {
	t := o.Total()
	if t == 0 {
		return 0
	}
	return 100 * float64(n) / float64(t)
}

// Elapsed is how long the batch took, as Run measured it.
func (o *Outcomes) Elapsed() time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.elapsed
}

func (o *Outcomes) setElapsed(d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.elapsed = d
}

// String summarizes the counts in a stable order, for test logs.
func (o *Outcomes) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%d RPCs", o.total)
	if o.elapsed > 0 {
		fmt.Fprintf(&b, " in %s", o.elapsed.Round(time.Millisecond))
	}
	cs := make([]codes.Code, 0, len(o.codes))
	for c := range o.codes {
		cs = append(cs, c)
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i] < cs[j] })
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s=%d", c, o.codes[c]))
	}
	fmt.Fprintf(&b, "; codes: %s", strings.Join(parts, " "))
	for _, m := range []struct {
		name string
		m    map[string]int
	}{{"workloads", o.workloads}, {"versions", o.versions}, {"clusters", o.clusters}, {"peers", o.peers},
		{"client issuers", o.issuers}, {"server issuers", o.servers}, {"errors", o.errors}} {
		if len(m.m) == 0 {
			continue
		}
		parts = parts[:0]
		for _, k := range sortedKeys(m.m) {
			name := k
			if name == "" {
				name = `""`
			}
			parts = append(parts, fmt.Sprintf("%s=%d", name, m.m[k]))
		}
		fmt.Fprintf(&b, "; %s: %s", m.name, strings.Join(parts, " "))
	}
	return b.String()
}
