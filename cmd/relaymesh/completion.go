package main

import (
	"bytes"
	"fmt"
	"os"

	"github.com/relaymesh/relaymesh/internal/clidoc"
	"github.com/spf13/cobra"
)

func newCompletionCommand(d deps) *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish|powershell",
		Short: "Print a shell completion script",
		Long: `Print the completion script of a shell: commands, flags, kubeconfig
contexts (--context, --mgmt-context, --remote-context) and output formats
complete with TAB.`,
		Example: `  # bash, for this session, then for good
  source <(relaymesh completion bash)
  relaymesh completion bash > /etc/bash_completion.d/relaymesh

  # zsh (completion must be enabled: autoload -U compinit; compinit)
  relaymesh completion zsh > "${fpath[1]}/_relaymesh"

  # fish
  relaymesh completion fish > ~/.config/fish/completions/relaymesh.fish`,
		ValidArgs: []string{"bash", "zsh", "fish", "powershell"},
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("want one shell: bash, zsh, fish or powershell")
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			root := c.Root()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(d.stdout, true)
			case "zsh":
				return root.GenZshCompletion(d.stdout)
			case "fish":
				return root.GenFishCompletion(d.stdout, true)
			case "powershell":
				return root.GenPowerShellCompletionWithDesc(d.stdout)
			}
			return usagef("unknown shell %q: want bash, zsh, fish or powershell", args[0])
		},
	}
}

// cliPreamble opens docs/cli.md.
const cliPreamble = `Every command's ` + "`--help`" + ` prints the same text. Clusters are reached the way
kubectl reaches them: ` + "`--kubeconfig`" + `, else ` + "`$KUBECONFIG`" + ` (several files, merged), else
` + "`~/.kube/config`" + `, else the in-cluster service account; ` + "`--context`" + ` picks the
context. Commands that work on the management cluster and a workload cluster at once
take ` + "`--mgmt-context`" + ` and ` + "`--remote-context`" + `, so one merged kubeconfig with a context per
cluster serves them all. Commands that print objects take ` + "`-o table|wide|json|yaml`" + `.

## Exit codes

| code | meaning |
| --- | --- |
| 0 | success |
| 1 | the command could not do its work: a cluster or file it needs is unreachable, an object is missing, the server refused (` + "`check`" + `: warnings found) |
| 2 | the command line is wrong: an unknown command or flag, a missing or malformed argument or flag value; nothing was changed (` + "`check`" + `: errors found, or the management cluster cannot be read at all) |

A command whose codes say more (` + "`check`" + `, ` + "`version`" + `) says so in its description.`

func newDocsCommand(d deps) *cobra.Command {
	var check string
	c := &cobra.Command{
		Use:    "docs",
		Short:  "Print the command reference (docs/cli.md) generated from the command tree",
		Hidden: true,
		Example: `  relaymesh docs > docs/cli.md
  relaymesh docs --check docs/cli.md`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			var b bytes.Buffer
			if err := clidoc.Write(&b, c.Root(), cliPreamble); err != nil {
				return err
			}
			if check == "" {
				_, err := d.stdout.Write(b.Bytes())
				return err
			}
			have, err := os.ReadFile(check)
			if err != nil {
				return err
			}
			if !bytes.Equal(have, b.Bytes()) {
				return fmt.Errorf("%s is stale: run 'go run ./cmd/relaymesh docs > %s' and commit it", check, check)
			}
			return nil
		},
	}
	c.Flags().StringVar(&check, "check", "", "compare with this file and fail if it differs, instead of printing")
	return c
}
