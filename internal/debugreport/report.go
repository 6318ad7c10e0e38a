// Package debugreport collects one archive (tar.gz) for a support case or
// a bug report: the server's /debug snapshots and metrics, the agents'
// metrics and health, recent logs, versions, the statuses of Relaymesh's
// custom resources and the objects around them, and the output of
// relaymesh check.
//
// Nothing secret goes in. Secrets are never dumped: only their names,
// types, key names, sizes and — for certificates — subject, serial and
// validity. Every file passes a Redactor before it is written, which
// removes PEM private keys, JWTs, bootstrap-token secrets, bearer tokens
// and the value of every Secret the collector read (and the token it used
// for /debug), wherever they appear. A part that cannot be collected is
// listed in manifest.json with the reason; the archive is still written.
package debugreport

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/opsclient"
	"go.step.sm/crypto/pemutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// Cluster is a cluster to collect from.
type Cluster struct {
	// Name is the directory under clusters/ ("mgmt", a context name).
	Name    string
	Clients *kubeclient.Clients
	// Err is why there are no clients.
	Err error
	// Namespaces to collect objects, Secret summaries, events and pod
	// logs from.
	Namespaces []string
	// Resources are the custom resources to dump (all namespaces).
	Resources []schema.GroupVersionResource
	// PodSelector picks the pods whose logs are collected (e.g.
	// app.kubernetes.io/name=relaymesh-agent).
	PodSelector string
	// Ops reads the operations port of the Relaymesh process of this
	// cluster (an agent's); nil: not read.
	Ops *opsclient.Client
	// OpsPaths are read from Ops (e.g. /metrics, /readyz).
	OpsPaths []string
}

// Config says what to collect.
type Config struct {
	// Clusters are the management cluster and the workload clusters.
	Clusters []Cluster
	// Server reads the server's operations port: /metrics and, with a
	// token, /debug/*.
	Server *opsclient.Client
	// DebugPaths are the server's /debug endpoints to read.
	DebugPaths []string
	// LogFiles are logs of processes that do not run in pods: archive
	// name (e.g. "server") → file path. At most TailBytes of each.
	LogFiles map[string]string
	// Extra are documents to add as they are (version.json, check.json):
	// archive path → value (marshalled as JSON unless []byte or string).
	Extra map[string]any
	// PodLogLines is how many lines of each container's log; default 2000.
	PodLogLines int64
	// TailBytes bounds each log file; default 4 MiB.
	TailBytes int64
	// Redactor; one is made if nil. Callers add the secrets they hold.
	Redactor *Redactor
	// Now stamps the archive.
	Now time.Time
}

// Part is one entry of the manifest.
type Part struct {
	Path   string `json:"path"`
	Source string `json:"source"`
	Bytes  int    `json:"bytes,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Manifest lists what the archive holds and what could not be collected.
type Manifest struct {
	Created time.Time `json:"created"`
	Parts   []Part    `json:"parts"`
}

// archive writes redacted files into a tar.gz under a top directory.
type archive struct {
	tw       *tar.Writer
	top      string
	now      time.Time
	redactor *Redactor
	manifest Manifest
}

func (a *archive) add(name, source string, body []byte, err error) {
	p := Part{Path: name, Source: source}
	if err != nil {
		p.Error = a.clean(err.Error())
	}
	if body != nil {
		body = a.redactor.Redact(body)
		if werr := a.write(name, body); werr != nil && p.Error == "" {
			p.Error = werr.Error()
		}
		p.Bytes = len(body)
	}
	a.manifest.Parts = append(a.manifest.Parts, p)
}

func (a *archive) clean(s string) string { return string(a.redactor.Redact([]byte(s))) }

func (a *archive) write(name string, body []byte) error {
	if err := a.tw.WriteHeader(&tar.Header{Name: path.Join(a.top, name), Mode: 0o600, Size: int64(len(body)), ModTime: a.now, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := a.tw.Write(body)
	return err
}

func (a *archive) addJSON(name, source string, v any, err error) {
	if v == nil && err != nil {
		a.add(name, source, nil, err)
		return
	}
	b, merr := json.MarshalIndent(v, "", "  ")
	if merr != nil {
		a.add(name, source, nil, merr)
		return
	}
	a.add(name, source, append(b, '\n'), err)
}

// Write collects and writes the archive to w. It fails only when the
// archive itself cannot be written.
func Write(ctx context.Context, w io.Writer, cfg Config) (*Manifest, error) {
	if cfg.Redactor == nil {
		cfg.Redactor = &Redactor{}
	}
	if cfg.PodLogLines == 0 {
		cfg.PodLogLines = 2000
	}
	if cfg.TailBytes == 0 {
		cfg.TailBytes = 4 << 20
	}
	if cfg.Server != nil && cfg.Server.Token != "" {
		cfg.Redactor.Add([]byte(cfg.Server.Token))
	}
	gz := gzip.NewWriter(w)
	a := &archive{tw: tar.NewWriter(gz), top: "relaymesh-debug-" + cfg.Now.UTC().Format("20060102T150405Z"), now: cfg.Now, redactor: cfg.Redactor,
		manifest: Manifest{Created: cfg.Now.UTC()}}

	// Secrets first: their values must be known before anything is written.
	summaries := map[string][]SecretSummary{}
	for _, c := range cfg.Clusters {
		if c.Clients == nil {
			continue
		}
		for _, ns := range c.Namespaces {
			list, err := c.Clients.Typed.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				continue
			}
			for i := range list.Items {
				addSecretValues(cfg.Redactor, &list.Items[i])
				summaries[c.Name+"/"+ns] = append(summaries[c.Name+"/"+ns], Summarize(&list.Items[i]))
			}
		}
	}

	names := make([]string, 0, len(cfg.Extra))
	for n := range cfg.Extra {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		switch v := cfg.Extra[n].(type) {
		case []byte:
			a.add(n, "relaymesh", v, nil)
		case string:
			a.add(n, "relaymesh", []byte(v), nil)
		default:
			a.addJSON(n, "relaymesh", v, nil)
		}
	}

	if s := cfg.Server; s != nil {
		body, err := s.Get(ctx, "/metrics")
		a.add("server/metrics.txt", s.Where()+"/metrics", body, err)
		for _, p := range cfg.DebugPaths {
			name := "server/debug/" + strings.ReplaceAll(strings.TrimPrefix(p, "/debug/"), "/", "-") + ".json"
			body, err := s.Get(ctx, p)
			if err != nil {
				body = nil
			}
			a.add(name, s.Where()+p, body, err)
		}
	}
	logNames := make([]string, 0, len(cfg.LogFiles))
	for n := range cfg.LogFiles {
		logNames = append(logNames, n)
	}
	sort.Strings(logNames)
	for _, n := range logNames {
		body, err := tail(cfg.LogFiles[n], cfg.TailBytes)
		a.add("logs/"+n+".log", "file "+cfg.LogFiles[n], body, err)
	}

	for _, c := range cfg.Clusters {
		dir := "clusters/" + SafeName(c.Name) + "/"
		if c.Clients == nil && c.Ops == nil {
			a.add(dir+"unreachable.txt", c.Name, nil, c.Err)
			continue
		}
		if c.Clients == nil {
			collectOps(ctx, a, c, dir)
			continue
		}
		collectCluster(ctx, a, cfg, c, dir, summaries)
	}

	a.addJSON("manifest.json", "relaymesh debug report", a.manifest, nil)
	if err := a.tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return &a.manifest, nil
}

func collectCluster(ctx context.Context, a *archive, cfg Config, c Cluster, dir string, summaries map[string][]SecretSummary) {
	k := c.Clients
	if v, err := k.Typed.Discovery().ServerVersion(); err == nil {
		a.addJSON(dir+"kubernetes-version.json", "discovery", v, nil)
	} else {
		a.add(dir+"kubernetes-version.json", "discovery", nil, err)
	}
	for _, gvr := range c.Resources {
		list, err := k.Dynamic.Resource(gvr).Namespace("").List(ctx, metav1.ListOptions{})
		name := dir + "resources/" + gvr.Resource + "." + gvr.Group + ".yaml"
		if err != nil {
			a.add(name, gvr.String(), nil, err)
			continue
		}
		a.add(name, gvr.String(), objectsYAML(list.Items), nil)
	}
	for _, ns := range c.Namespaces {
		nsDir := dir + "namespaces/" + ns + "/"
		a.addJSON(nsDir+"secrets.json", "secrets (names, keys, sizes, certificates; never values)", orEmpty(summaries[c.Name+"/"+ns]), nil)
		if list, err := k.Typed.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{}); err == nil {
			items := make([]unstructured.Unstructured, 0, len(list.Items))
			for i := range list.Items {
				items = append(items, toUnstructured(&list.Items[i], "v1", "ConfigMap"))
			}
			a.add(nsDir+"configmaps.yaml", "configmaps", objectsYAML(items), nil)
		} else {
			a.add(nsDir+"configmaps.yaml", "configmaps", nil, err)
		}
		if list, err := k.Typed.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{}); err == nil {
			a.addJSON(nsDir+"leases.json", "leases", list.Items, nil)
		} else {
			a.add(nsDir+"leases.json", "leases", nil, err)
		}
		if list, err := k.Typed.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); err == nil {
			a.add(nsDir+"events.txt", "events", events(list.Items), nil)
		} else {
			a.add(nsDir+"events.txt", "events", nil, err)
		}
		if c.PodSelector != "" {
			collectPodLogs(ctx, a, cfg, k, ns, c.PodSelector, nsDir+"logs/")
		}
	}
	collectOps(ctx, a, c, dir)
}

// collectOps reads the paths of a process's operations port.
func collectOps(ctx context.Context, a *archive, c Cluster, dir string) {
	if c.Ops == nil {
		return
	}
	for _, p := range c.OpsPaths {
		body, err := c.Ops.Get(ctx, p)
		a.add(dir+strings.Trim(strings.ReplaceAll(p, "/", "-"), "-")+".txt", c.Ops.Where()+p, body, err)
	}
}

func collectPodLogs(ctx context.Context, a *archive, cfg Config, k *kubeclient.Clients, ns, selector, dir string) {
	pods, err := k.Typed.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		a.add(dir+"pods.txt", "pods "+selector, nil, err)
		return
	}
	if len(pods.Items) == 0 {
		a.add(dir+"pods.txt", "pods "+selector, nil, fmt.Errorf("no pods match %s in %s (processes outside pods: give their log files)", selector, ns))
		return
	}
	lines := cfg.PodLogLines
	limit := cfg.TailBytes
	for _, p := range pods.Items {
		for _, ctr := range p.Spec.Containers {
			name := fmt.Sprintf("%s%s_%s.log", dir, p.Name, ctr.Name)
			rc, err := k.Typed.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: ctr.Name, TailLines: &lines, LimitBytes: &limit}).Stream(ctx)
			if err != nil {
				a.add(name, "pod log", nil, err)
				continue
			}
			body, err := io.ReadAll(io.LimitReader(rc, limit))
			_ = rc.Close()
			a.add(name, "pod log", body, err)
		}
	}
}

// SafeName is name as one path element of the archive: a kubeconfig
// context may be named anything ("arn:aws:eks:…:cluster/prod", "../x"), and
// no entry may land outside its directory. Characters other than letters,
// digits, '.', '_' and '-' become '_', and a name of dots alone is
// prefixed with '_'.
func SafeName(name string) string {
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	s := string(b)
	if strings.Trim(s, ".") == "" {
		s = "_" + s
	}
	return s
}

// tail reads at most n bytes from the end of a file.
func tail(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if info.Size() > n {
		if _, err := f.Seek(info.Size()-n, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, n))
}

// objectsYAML writes objects as a YAML stream without managed fields and
// last-applied annotations (noise, and a copy of what was applied).
func objectsYAML(items []unstructured.Unstructured) []byte {
	var b strings.Builder
	for i := range items {
		o := items[i].DeepCopy()
		unstructured.RemoveNestedField(o.Object, "metadata", "managedFields")
		unstructured.RemoveNestedField(o.Object, "metadata", "annotations", "kubectl.kubernetes.io/last-applied-configuration")
		if o.GetKind() == "Secret" {
			unstructured.RemoveNestedField(o.Object, "data")
			unstructured.RemoveNestedField(o.Object, "stringData")
		}
		y, err := yaml.Marshal(o.Object)
		if err != nil {
			continue
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	return []byte(b.String())
}

func toUnstructured(obj any, apiVersion, kind string) unstructured.Unstructured {
	b, _ := json.Marshal(obj)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	u := unstructured.Unstructured{Object: m}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	return u
}

func events(list []corev1.Event) []byte {
	sort.Slice(list, func(i, j int) bool { return eventTime(list[i]).Before(eventTime(list[j])) })
	var b strings.Builder
	for _, e := range list {
		fmt.Fprintf(&b, "%s %s %s/%s %s: %s\n", eventTime(e).UTC().Format(time.RFC3339), e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
	}
	return []byte(b.String())
}

func eventTime(e corev1.Event) time.Time {
	if !e.LastTimestamp.IsZero() {
		return e.LastTimestamp.Time
	}
	return e.EventTime.Time
}

// SecretSummary is what the report says of a Secret: never a value.
type SecretSummary struct {
	Name         string                 `json:"name"`
	Type         corev1.SecretType      `json:"type"`
	Labels       map[string]string      `json:"labels,omitempty"`
	Created      time.Time              `json:"created"`
	Keys         map[string]int         `json:"keys"`
	Certificates map[string][]CertBrief `json:"certificates,omitempty"`
}

// CertBrief describes a certificate.
type CertBrief struct {
	Subject   string    `json:"subject"`
	Issuer    string    `json:"issuer"`
	Serial    string    `json:"serial"`
	NotBefore time.Time `json:"notBefore"`
	NotAfter  time.Time `json:"notAfter"`
	IsCA      bool      `json:"isCA"`
	URIs      []string  `json:"uris,omitempty"`
	DNSNames  []string  `json:"dnsNames,omitempty"`
}

// Summarize describes a Secret: key names and sizes, and the certificates
// of keys that hold only certificates.
func Summarize(s *corev1.Secret) SecretSummary {
	sum := SecretSummary{Name: s.Name, Type: s.Type, Labels: s.Labels, Created: s.CreationTimestamp.UTC(), Keys: map[string]int{}}
	for k, v := range s.Data {
		sum.Keys[k] = len(v)
		if !onlyCertificates(v) {
			continue
		}
		certs, err := pemutil.ParseCertificateBundle(v)
		if err != nil {
			continue
		}
		if sum.Certificates == nil {
			sum.Certificates = map[string][]CertBrief{}
		}
		for _, c := range certs {
			sum.Certificates[k] = append(sum.Certificates[k], brief(c))
		}
	}
	return sum
}

func brief(c *x509.Certificate) CertBrief {
	b := CertBrief{Subject: c.Subject.String(), Issuer: c.Issuer.String(), Serial: c.SerialNumber.Text(16), NotBefore: c.NotBefore.UTC(), NotAfter: c.NotAfter.UTC(),
		IsCA: c.IsCA, DNSNames: c.DNSNames}
	for _, u := range c.URIs {
		b.URIs = append(b.URIs, u.String())
	}
	return b
}

// tokenRecordType is the type of a bootstrap-token record (identity's
// TokenSecretType); tokenRecordPublic are its keys that are neither a
// secret nor a digest of one: redacting a spent token's registration (the
// KubernetesCluster's UID) or its times would hide them wherever they
// appear in the report.
const tokenRecordType = "relaymesh.io/bootstrap-token"

var tokenRecordPublic = map[string]bool{"expires-at": true, "spent-registration": true, "spent-at": true}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// addSecretValues registers the values of a Secret with the redactor,
// except those that are also one of its labels' values (public metadata,
// such as the cluster of a bootstrap-token record) and a bootstrap-token
// record's public keys (tokenRecordPublic).
func addSecretValues(r *Redactor, s *corev1.Secret) {
	public := map[string]bool{}
	for _, v := range s.Labels {
		public[v] = true
	}
	for k, v := range s.Data {
		if s.Type == tokenRecordType && tokenRecordPublic[k] {
			continue
		}
		if !public[string(v)] {
			r.Add(v)
		}
	}
	for _, v := range s.StringData {
		if !public[v] {
			r.Add([]byte(v))
		}
	}
}
