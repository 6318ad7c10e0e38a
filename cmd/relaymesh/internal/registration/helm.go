package registration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"time"

	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/cli"
	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/getter"
	"helm.sh/helm/v3/pkg/registry"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
)

// AgentChartName is the chart registration installs.
const AgentChartName = "relaymesh-agent"

// Chart says which chart to install or render, and how.
type Chart struct {
	// Ref is a chart directory, a packaged .tgz, an oci:// reference or a
	// repository URL (Helm's own rules).
	Ref string
	// Version constrains the chart's version (oci and repositories); empty:
	// the latest.
	Version string
	// Release is the Helm release's name; default AgentChartName.
	Release string
	// ValueFiles and Set are the user's values (-f, --set), merged in that
	// order under the bundle's values, which always win: the cluster's
	// name and server address are the registration's.
	ValueFiles []string
	Set        []string
	// Timeout bounds the install; default 5 minutes.
	Timeout time.Duration
	// Wait waits for the Deployment to be ready.
	Wait bool
}

func (c Chart) release() string {
	if c.Release == "" {
		return AgentChartName
	}
	return c.Release
}

// Loaded is a chart located, loaded and checked, with the user's values
// parsed: what can fail before anything is registered.
type Loaded struct {
	chart *chart.Chart
	user  map[string]any
}

// Load locates and loads the chart and parses the user's values. It
// refuses a chart that is not the agent chart (installing another chart
// with the bundle's values is a mistake nothing else would catch).
func (c Chart) Load() (*Loaded, error) {
	reg, err := registry.NewClient()
	if err != nil {
		return nil, fmt.Errorf("helm registry client: %w", err)
	}
	locate := action.NewInstall(&action.Configuration{RegistryClient: reg}) // its ChartPathOptions carry the registry client
	locate.Version = c.Version
	path, err := locate.LocateChart(c.Ref, cli.New())
	if err != nil {
		return nil, fmt.Errorf("chart %s: %w", c.Ref, err)
	}
	ch, err := loader.Load(path)
	if err != nil {
		return nil, fmt.Errorf("chart %s: %w", c.Ref, err)
	}
	if ch.Metadata == nil || ch.Metadata.Name != AgentChartName {
		return nil, fmt.Errorf("chart %s is not the %s chart", c.Ref, AgentChartName)
	}
	opts := values.Options{ValueFiles: c.ValueFiles, Values: c.Set}
	user, err := opts.MergeValues(getter.All(cli.New()))
	if err != nil {
		return nil, fmt.Errorf("chart values: %w", err)
	}
	return &Loaded{chart: ch, user: user}, nil
}

// values are the user's values with the bundle's over them.
func (l *Loaded) values(b *Bundle) map[string]any {
	vals := maps.Clone(l.user)
	if vals == nil {
		vals = map[string]any{}
	}
	maps.Copy(vals, b.Values)
	return vals
}

// InstallChart installs the agent chart into the bundle's namespace of the
// workload cluster src, or upgrades the release if it exists. It returns
// the release.
func InstallChart(ctx context.Context, src kubeclient.Source, b *Bundle, c Chart, l *Loaded, log io.Writer) (*release.Release, error) {
	cfg, err := helmConfig(src, b.Namespace, log)
	if err != nil {
		return nil, err
	}
	ch, vals := l.chart, l.values(b)
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 5 * time.Minute
	}
	history := action.NewHistory(cfg)
	history.Max = 1
	if _, err := history.Run(c.release()); errors.Is(err, driver.ErrReleaseNotFound) {
		install := action.NewInstall(cfg)
		install.ReleaseName, install.Namespace, install.Timeout, install.Wait = c.release(), b.Namespace, timeout, c.Wait
		rel, err := install.RunWithContext(ctx, ch, vals)
		if err != nil {
			return nil, fmt.Errorf("helm install %s: %w", c.release(), err)
		}
		return rel, nil
	} else if err != nil {
		return nil, fmt.Errorf("helm history %s: %w", c.release(), err)
	}
	upgrade := action.NewUpgrade(cfg)
	upgrade.Namespace, upgrade.Timeout, upgrade.Wait = b.Namespace, timeout, c.Wait
	rel, err := upgrade.RunWithContext(ctx, c.release(), ch, vals)
	if err != nil {
		return nil, fmt.Errorf("helm upgrade %s: %w", c.release(), err)
	}
	return rel, nil
}

// RenderChart renders the agent chart with the bundle's values without a
// cluster (helm template), for a GitOps repository.
func RenderChart(c Chart, l *Loaded, b *Bundle) (string, error) {
	cfg := &action.Configuration{Capabilities: chartutil.DefaultCapabilities, Log: func(string, ...any) {}}
	ch, vals := l.chart, l.values(b)
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace = c.release(), b.Namespace
	install.DryRun, install.ClientOnly, install.Replace, install.IncludeCRDs = true, true, true, true
	rel, err := install.Run(ch, vals)
	if err != nil {
		return "", fmt.Errorf("render %s: %w", c.Ref, err)
	}
	return rel.Manifest, nil
}

// helmConfig is Helm's action configuration for the cluster src, with
// releases stored as Secrets in namespace (Helm's default driver).
func helmConfig(src kubeclient.Source, namespace string, log io.Writer) (*action.Configuration, error) {
	getter := &restGetter{src: src, namespace: namespace}
	cfg := &action.Configuration{}
	logger := slog.New(slog.NewTextHandler(log, nil)).With("component", "helm")
	if err := cfg.Init(getter, namespace, "secret", func(format string, v ...any) { logger.Debug(fmt.Sprintf(format, v...)) }); err != nil {
		return nil, fmt.Errorf("helm: %w", err)
	}
	return cfg, nil
}

// restGetter gives Helm the workload cluster of a kubeclient.Source.
type restGetter struct {
	src       kubeclient.Source
	namespace string
}

func (g *restGetter) ToRESTConfig() (*rest.Config, error) {
	cfg, _, err := g.src.RESTConfig()
	return cfg, err
}

func (g *restGetter) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) {
	cfg, err := g.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return memory.NewMemCacheClient(dc), nil
}

func (g *restGetter) ToRESTMapper() (meta.RESTMapper, error) {
	dc, err := g.ToDiscoveryClient()
	if err != nil {
		return nil, err
	}
	return restmapper.NewDeferredDiscoveryRESTMapper(dc), nil
}

func (g *restGetter) ToRawKubeConfigLoader() clientcmd.ClientConfig {
	return g.src.ClientConfig(g.namespace)
}
