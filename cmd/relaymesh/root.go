package main

import (
	"fmt"
	"strings"

	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/printer"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// defaultNamespace is where Relaymesh runs: the server's namespace in the
// management cluster, the agent's in a workload cluster.
const defaultNamespace = "relaymesh"

// globals are the flags every command has.
type globals struct {
	kubeconfig kubeconfigFlag
	context    string
	namespace  string
}

// kubeconfigFlag is --kubeconfig. It may be given once, except where a
// command says otherwise (ca verify takes one per workload cluster, as it
// always did).
type kubeconfigFlag []string

func (k *kubeconfigFlag) String() string     { return strings.Join(*k, ",") }
func (k *kubeconfigFlag) Set(v string) error { *k = append(*k, v); return nil }
func (k *kubeconfigFlag) Type() string       { return "file" }

// file is the one --kubeconfig given, or "".
func (k kubeconfigFlag) file() (string, error) {
	switch len(k) {
	case 0:
		return "", nil
	case 1:
		return k[0], nil
	}
	return "", usagef("--kubeconfig given %d times: name one file, or merge them (KUBECONFIG=a.yaml:b.yaml) and pick with --context", len(k))
}

// source is the cluster the global flags name.
func (g *globals) source() (kubeclient.Source, error) {
	file, err := g.kubeconfig.file()
	if err != nil {
		return kubeclient.Source{}, err
	}
	return kubeclient.Source{Kubeconfig: file, Context: g.context}, nil
}

// clients loads the cluster the global flags name.
func (g *globals) clients() (*kubeclient.Clients, error) {
	src, err := g.source()
	if err != nil {
		return nil, err
	}
	return src.Load()
}

func newRootCommand(d deps) *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "relaymesh",
		Short: "Multi-cluster trust and federation for Istio meshes",
		Long: `relaymesh is Relaymesh's single binary: the management server, the relay
agent of each workload cluster, and the commands that operate them.

Clusters are reached the way kubectl reaches them: --kubeconfig, else the
files of $KUBECONFIG, else ~/.kube/config, else (in a pod) the service
account; --context picks the context. Commands that work on the management
and a workload cluster at once take --mgmt-context and --remote-context, so
one merged kubeconfig serves every cluster. --namespace is Relaymesh's
namespace (default relaymesh), not the context's namespace.`,
		Example: `  # Check the whole installation, management cluster and every workload cluster
  relaymesh check --context mgmt

  # Register a workload cluster and install its agent with the Helm chart
  relaymesh cluster register cluster-1 --mgmt-context mgmt --remote-context cluster-1 \
    --server-address relay.example.com:9900 --chart charts/relaymesh-agent

  # Shell completion for the current bash session
  source <(relaymesh completion bash)`,
		SilenceErrors:     true,
		SilenceUsage:      true,
		Args:              cobra.ArbitraryArgs,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				fmt.Fprint(d.stderr, c.UsageString())
				return usagef("want a command")
			}
			return usagef("unknown command %q", args[0])
		},
	}
	root.SetOut(d.stdout)
	root.SetErr(d.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.Var(&g.kubeconfig, "kubeconfig", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the in-cluster service account)")
	pf.StringVar(&g.context, "context", "", "kubeconfig context (default: the current context)")
	pf.StringVarP(&g.namespace, "namespace", "n", defaultNamespace, "Relaymesh's namespace: the server's in the management cluster, the agent's in a workload cluster")
	_ = root.RegisterFlagCompletionFunc("context", completeContexts(g))

	root.AddCommand(
		newServerCommand(d, g),
		newAgentCommand(d, g),
		newClusterCommand(d, g),
		newTokenCommand(d, g),
		newCACommand(d, g),
		newPolicyCommand(d, g),
		newDescribeCommand(d, g),
		newAuditCommand(d, g),
		newCheckCommand(d, g),
		newDebugCommand(d, g),
		newDashboardCommand(d, g),
		newVersionCommand(d, g),
		newCompletionCommand(d),
		newDocsCommand(d),
	)
	root.SetHelpCommand(newHelpCommand())
	return root
}

// newHelpCommand is `relaymesh help [COMMAND]`, which completes command
// names.
func newHelpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND]",
		Short: "Help about any command",
		Example: `  relaymesh help cluster register
  relaymesh cluster register --help`,
		ValidArgsFunction: func(c *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
			cmd, _, err := c.Root().Find(args)
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var names []string
			for _, s := range cmd.Commands() {
				if s.IsAvailableCommand() {
					names = append(names, s.Name())
				}
			}
			return names, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(c *cobra.Command, args []string) error {
			cmd, _, err := c.Root().Find(args)
			if err != nil || cmd == nil {
				return usagef("unknown help topic %q", strings.Join(args, " "))
			}
			cmd.SetOut(c.OutOrStdout())
			return cmd.Help()
		},
	}
}

// completeContexts completes kubeconfig context names.
func completeContexts(g *globals) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		src, err := g.source()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		names, err := src.Contexts()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// outputFlag adds -o/--output with the given formats (the first is the
// default) and completion for them.
// formatAndClients is the preamble of a read-only command with -o: the
// output format (a bad one is a usage error) and the management cluster's
// clients.
func formatAndClients(g *globals, output string) (printer.Format, *kubeclient.Clients, error) {
	format, err := printer.Parse(output, printer.Formats)
	if err != nil {
		return "", nil, usageError{err}
	}
	kube, err := g.clients()
	if err != nil {
		return "", nil, err
	}
	return format, kube, nil
}

func outputFlag(c *cobra.Command, out *string, formats []printer.Format, extra ...string) {
	names := append(printer.Names(formats), extra...)
	c.Flags().StringVarP(out, "output", "o", names[0], "output format: "+strings.Join(names, ", "))
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(names, cobra.ShellCompDirectiveNoFileComp))
}

// twoClusters are the flags of commands that work on the management
// cluster and a workload cluster at once.
type twoClusters struct {
	mgmtContext, remoteContext       string
	mgmtKubeconfig, remoteKubeconfig string
}

func (t *twoClusters) addFlags(fs *pflag.FlagSet, g *globals, remote bool) {
	fs.StringVar(&t.mgmtContext, "mgmt-context", "", "kubeconfig context of the management cluster (default: --context, else the current context)")
	fs.StringVar(&t.mgmtKubeconfig, "mgmt-kubeconfig", "", "kubeconfig file of the management cluster (default: --kubeconfig, $KUBECONFIG, ~/.kube/config)")
	if remote {
		fs.StringVar(&t.remoteContext, "remote-context", "", "kubeconfig context of the workload cluster")
		fs.StringVar(&t.remoteKubeconfig, "remote-kubeconfig", "", "kubeconfig file of the workload cluster (default: --kubeconfig, $KUBECONFIG, ~/.kube/config)")
	}
}

func (t *twoClusters) complete(c *cobra.Command, g *globals) {
	for _, f := range []string{"mgmt-context", "remote-context"} {
		if c.Flags().Lookup(f) != nil {
			_ = c.RegisterFlagCompletionFunc(f, completeContexts(g))
		}
	}
}

// mgmt is the management cluster: --mgmt-kubeconfig or --kubeconfig,
// --mgmt-context or --context.
func (t *twoClusters) mgmt(g *globals) (kubeclient.Source, error) {
	src, err := g.source()
	if err != nil {
		return src, err
	}
	if t.mgmtKubeconfig != "" {
		src.Kubeconfig = t.mgmtKubeconfig
	}
	if t.mgmtContext != "" {
		src.Context = t.mgmtContext
	}
	return src, nil
}

// mgmtClients loads the clients of the management cluster (mgmt).
func (t *twoClusters) mgmtClients(g *globals) (*kubeclient.Clients, error) {
	src, err := t.mgmt(g)
	if err != nil {
		return nil, err
	}
	c, err := src.Load()
	if err != nil {
		return nil, fmt.Errorf("management cluster: %w", err)
	}
	return c, nil
}

// remote is the workload cluster: --remote-kubeconfig or --kubeconfig,
// --remote-context, else a context named fallback (the cluster's name)
// when the kubeconfig has one. ok is false when neither names one.
func (t *twoClusters) remote(g *globals, fallback string) (src kubeclient.Source, ok bool, err error) {
	file, err := g.kubeconfig.file()
	if err != nil {
		return src, false, err
	}
	src = kubeclient.Source{Kubeconfig: file, Context: t.remoteContext}
	if t.remoteKubeconfig != "" {
		src.Kubeconfig = t.remoteKubeconfig
		return src, true, nil
	}
	if src.Context != "" {
		return src, true, nil
	}
	if fallback != "" && src.HasContext(fallback) {
		src.Context = fallback
		return src, true, nil
	}
	return src, false, nil
}

// workload is the workload cluster of a command that writes into cluster
// name unless dryRun: remote's source, or a usage error naming the flags
// (and orDryRun, how --dry-run would do without one). With dryRun it is
// the zero Source.
func (t *twoClusters) workload(g *globals, name string, dryRun bool, orDryRun string) (kubeclient.Source, error) {
	if dryRun {
		return kubeclient.Source{}, nil
	}
	src, ok, err := t.remote(g, name)
	if err != nil {
		return src, err
	}
	if !ok {
		return src, usagef("no workload cluster: give --remote-context (a context of your kubeconfig; default: a context named %s) or --remote-kubeconfig%s", name, orDryRun)
	}
	return src, nil
}
