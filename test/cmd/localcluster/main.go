// Command localcluster starts and stops local Kubernetes control planes (one
// etcd, one kube-apiserver per cluster) for the demo and for people:
//
//	go run ./test/cmd/localcluster up --dir _demo/clusters --clusters mgmt,cluster-1,cluster-2
//	KUBECONFIG=_demo/clusters/cluster-1.kubeconfig .cache/bin/kubectl get crds
//	go run ./test/cmd/localcluster down --dir _demo/clusters
//
// `up` returns once every API server is ready; the processes keep running
// until `down`. Binaries come from `make tools`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/relaymesh/relaymesh/test/localcluster"
)

const usage = `Usage: localcluster up|down --dir DIR [--clusters a,b,c]

Commands:
  up     start etcd and one kube-apiserver per cluster, install Relaymesh and
         Istio CRDs, write DIR/<cluster>.kubeconfig, and return; the
         processes run until 'down'
  down   stop the processes recorded in DIR and remove DIR

Flags:
`

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		newFlags(stdout).fs.PrintDefaults()
		if len(args) == 0 {
			return errors.New("a command is required: up or down")
		}
		return nil
	}
	cmd := args[0]
	f := newFlags(stderr)
	if err := f.fs.Parse(args[1:]); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", f.fs.Args())
	}
	if *f.dir == "" {
		return errors.New("--dir is required")
	}
	switch cmd {
	case "up":
		names, err := localcluster.ParseClusterNames(*f.clusters)
		if err != nil {
			return fmt.Errorf("--clusters: %w", err)
		}
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
		start := time.Now()
		env, err := localcluster.Start(ctx, localcluster.Config{Dir: *f.dir, Clusters: names, Detach: true})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "started %d clusters in %s\n", len(names), time.Since(start).Round(100*time.Millisecond))
		for _, c := range env.Clusters() {
			fmt.Fprintf(stdout, "  %-12s %s  kubeconfig: %s\n", c.Name, c.URL, c.Kubeconfig)
		}
		fmt.Fprintf(stdout, "stop them with: go run ./test/cmd/localcluster down --dir %s\n", *f.dir)
		return nil
	case "down":
		if err := localcluster.Down(*f.dir); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "stopped the clusters of %s\n", *f.dir)
		return nil
	default:
		return fmt.Errorf("unknown command %q: want up or down", cmd)
	}
}

type flags struct {
	fs       *flag.FlagSet
	dir      *string
	clusters *string
}

func newFlags(out io.Writer) *flags {
	fs := flag.NewFlagSet("localcluster", flag.ContinueOnError)
	fs.SetOutput(out)
	return &flags{
		fs:       fs,
		dir:      fs.String("dir", "", "directory for data, logs and kubeconfigs (required)"),
		clusters: fs.String("clusters", "mgmt,cluster-1,cluster-2", "comma-separated cluster names (DNS labels)"),
	}
}
