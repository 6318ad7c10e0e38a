package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/opsclient"
	"github.com/relaymesh/relaymesh/internal/opshttp"
	"github.com/relaymesh/relaymesh/internal/printer"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
)

// buildInfo is the relaymesh_build_info gauge of the server and the agent.
func buildInfo() prometheus.Collector { return opshttp.BuildInfo(version()) }

// serverOps are the flags that say how to reach the server's operations
// port (/metrics, /debug/*).
type serverOps struct {
	address, service, port, caFile string
	plainHTTP                      bool
}

func (s *serverOps) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&s.address, "server-metrics-address", "", "host:port of the server's metrics port (HTTPS), e.g. 127.0.0.1:9091 after 'kubectl -n relaymesh port-forward svc/relaymesh-server 9091' (default: through the management apiserver's service proxy)")
	fs.StringVar(&s.service, "server-service", "relaymesh-server", "the server's Service in --namespace, for the service proxy")
	fs.StringVar(&s.port, "server-metrics-port", "metrics", "the Service port (name or number) of the metrics port, for the service proxy")
	fs.StringVar(&s.caFile, "server-metrics-ca-file", "", "PEM file of the CA the metrics port's certificate is verified against (default: the relay root, relay-root-tls-secret ca.crt in --namespace; give this for a server run with --metrics-tls-cert)")
	fs.BoolVar(&s.plainHTTP, "server-metrics-plain-http", false, "WEAKER: reach the metrics port over plain HTTP (a server run with --metrics-plain-http); a /debug token is then sent to a loopback address only")
}

// client reaches the server's operations port of the management cluster
// mgmt (nil: only a direct address works), over HTTPS verified against
// --server-metrics-ca-file or the relay root unless --server-metrics-plain-http.
func (s *serverOps) client(mgmt *kubeclient.Clients, namespace string) *opsclient.Client {
	c := &opsclient.Client{Address: s.address, Namespace: namespace, Service: s.service, Port: s.port,
		DirectHint: "pass the metrics port's address with --server-metrics-address HOST:PORT (e.g. 127.0.0.1:9091 for a server on this machine, or after 'kubectl -n " + namespace + " port-forward svc/" + s.service + " 9091'), or the Service's name with --server-service"}
	if mgmt != nil {
		c.Kube = mgmt.Typed
	}
	if !s.plainHTTP {
		c.RootCAs = s.rootCAs(c.Kube, namespace)
	}
	return c
}

// rootCAs reads the CA the metrics port is verified against: the file of
// --server-metrics-ca-file, else the relay root of the management
// cluster.
func (s *serverOps) rootCAs(kube kubernetes.Interface, namespace string) func(context.Context) (*x509.CertPool, error) {
	return func(ctx context.Context) (*x509.CertPool, error) {
		var pemBytes []byte
		switch {
		case s.caFile != "":
			b, err := readFileBounded(s.caFile, 1<<20)
			if err != nil {
				return nil, fmt.Errorf("--server-metrics-ca-file: %w", err)
			}
			pemBytes = b
		case kube == nil:
			return nil, errors.New("no management cluster to read the relay root from: give --server-metrics-ca-file")
		default:
			b, err := ca.RelayRootsPEM(ctx, kube, namespace)
			if err != nil {
				return nil, fmt.Errorf("the relay root (or give --server-metrics-ca-file): %w", err)
			}
			pemBytes = b
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pemBytes) {
			return nil, errors.New("no PEM certificate in the CA to verify the metrics port with")
		}
		return pool, nil
	}
}

// componentVersion is one line of relaymesh version.
type componentVersion struct {
	Component string `json:"component"`
	Version   string `json:"version,omitempty"`
	// Build is the client's checkout, as Go recorded it.
	Build  *build `json:"build,omitempty"`
	Source string `json:"source,omitempty"`
	Error  string `json:"error,omitempty"`
}

// clientVersion is this binary's line: its version and, in Source, the
// commit it was built from, or why that is unknown.
func clientVersion() componentVersion {
	v := componentVersion{Component: "client", Version: version(), Source: "this binary"}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	b := buildOf(info)
	switch {
	case releaseVersion != "":
		v.Source += " (release build)"
	case b.Revision == "":
		v.Source += " (built without VCS information — go run, go test or -buildvcs=false — so its commit is unknown)"
	default:
		v.Build = &b
		v.Source += " (commit " + b.Revision[:min(12, len(b.Revision))]
		if b.Time != "" {
			v.Source += " of " + b.Time
		}
		if b.Modified {
			v.Source += ", with uncommitted changes"
		}
		v.Source += ")"
	}
	return v
}

// versions is what relaymesh version prints.
type versions struct {
	Client componentVersion   `json:"client"`
	Server *componentVersion  `json:"server,omitempty"`
	Agents []componentVersion `json:"agents,omitempty"`
}

func (v versions) all() []componentVersion {
	out := []componentVersion{v.Client}
	if v.Server != nil {
		out = append(out, *v.Server)
	}
	return append(out, v.Agents...)
}

func (v versions) Columns(wide bool) []string {
	if wide {
		return []string{"COMPONENT", "VERSION", "SOURCE", "ERROR"}
	}
	return []string{"COMPONENT", "VERSION", "ERROR"}
}

func (v versions) Rows(wide bool) [][]string {
	var rows [][]string
	for _, c := range v.all() {
		if wide {
			rows = append(rows, []string{c.Component, c.Version, c.Source, c.Error})
		} else {
			rows = append(rows, []string{c.Component, c.Version, c.Error})
		}
	}
	return rows
}

func newVersionCommand(d deps, g *globals) *cobra.Command {
	var ops serverOps
	var output string
	var clientOnly bool
	c := &cobra.Command{
		Use:   "version",
		Short: "Print the client's, the server's and the agents' versions",
		Long: `Print this client's version, the management server's (read from the
relaymesh_build_info metric of its metrics port, directly with
--server-metrics-address or through the management apiserver's service
proxy) and each registered agent's (as the agent reported it to the server
over the relay, from its KubernetesCluster status). Exits 1 if the server
cannot be asked; --client prints the client's alone.`,
		Example: `  relaymesh version --context mgmt
  relaymesh version --client
  relaymesh version --server-metrics-address 127.0.0.1:9091 -o json`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			format, err := printer.Parse(output, printer.Formats)
			if err != nil {
				return usageError{err}
			}
			v := versions{Client: clientVersion()}
			if clientOnly {
				return printer.Print(d.stdout, format, v)
			}
			failed := collectVersions(c.Context(), g, &ops, &v)
			if err := printer.Print(d.stdout, format, v); err != nil {
				return err
			}
			return failed
		},
	}
	ops.addFlags(c.Flags())
	c.Flags().BoolVar(&clientOnly, "client", false, "print the client's version only")
	outputFlag(c, &output, printer.Formats)
	return c
}

// collectVersions fills in the server's and the agents' versions; it
// returns an error when the server's could not be read.
func collectVersions(ctx context.Context, g *globals, ops *serverOps, v *versions) error {
	server := &componentVersion{Component: "server"}
	v.Server = server
	var mgmt *kubeclient.Clients
	mgmt, kubeErr := g.clients()
	client := ops.client(mgmt, g.namespace)
	server.Source = client.Where() + "/metrics"
	if kubeErr != nil && ops.address == "" {
		server.Error = kubeErr.Error()
		return kubeErr
	}
	var serverErr error
	if body, err := client.Get(ctx, "/metrics"); err != nil {
		serverErr = err
	} else if m, err := opsclient.ParseMetrics(body); err != nil {
		serverErr = err
	} else if server.Version, err = opsclient.Version(m); err != nil {
		serverErr = err
	}
	if serverErr != nil {
		server.Error = serverErr.Error()
	}
	if kubeErr != nil {
		return serverErr
	}
	kcs, err := listAs[multiclusterv1alpha1.KubernetesCluster](ctx, mgmt.Dynamic, multiclusterv1alpha1.KubernetesClusters, g.namespace)
	if err != nil {
		v.Agents = append(v.Agents, componentVersion{Component: "agents", Error: err.Error()})
		return serverErr
	}
	sort.Slice(kcs, func(i, j int) bool { return kcs[i].Name < kcs[j].Name })
	for _, kc := range kcs {
		a := componentVersion{Component: "agent/" + kc.Name, Version: kc.Status.AgentVersion, Source: "KubernetesCluster status (reported over the relay)"}
		if a.Version == "" {
			a.Error = "not reported yet (the agent never connected)"
		}
		v.Agents = append(v.Agents, a)
	}
	return serverErr
}

// readFileBounded reads path, refusing one larger than limit bytes.
func readFileBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return b, nil
}
