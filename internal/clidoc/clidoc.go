// Package clidoc renders a cobra command tree as one Markdown page
// (docs/cli.md): every command in depth-first order with its synopsis,
// description, examples and flags, inherited flags listed once at the top.
// The output depends only on the tree, so a stale page can be detected by
// rendering it again and comparing.
package clidoc

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Write renders root and every command under it that is not hidden.
func Write(w io.Writer, root *cobra.Command, preamble string) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# %s command reference\n\n", root.Name())
	b.WriteString("<!-- Generated from the command tree by `go run ./cmd/relaymesh docs > docs/cli.md`; `make verify` fails when it is stale. Do not edit. -->\n\n")
	if preamble != "" {
		b.WriteString(strings.TrimSpace(preamble) + "\n\n")
	}
	cmds := walk(root)
	b.WriteString("## Commands\n\n")
	for _, c := range cmds[1:] {
		indent := strings.Repeat("  ", depth(c)-1)
		fmt.Fprintf(&b, "%s- [`%s`](#%s) — %s\n", indent, c.CommandPath(), anchor(c), c.Short)
	}
	b.WriteString("\n## Global flags\n\nEvery command takes these.\n\n")
	writeFlags(&b, root.PersistentFlags())
	for _, c := range cmds {
		section(&b, c)
	}
	_, err := w.Write(b.Bytes())
	return err
}

func walk(c *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{c}
	for _, s := range c.Commands() {
		if s.Hidden || s.Deprecated != "" {
			continue
		}
		out = append(out, walk(s)...)
	}
	return out
}

func depth(c *cobra.Command) int {
	n := 0
	for p := c; p.HasParent(); p = p.Parent() {
		n++
	}
	return n
}

// anchor is the GitHub anchor of a command's heading.
func anchor(c *cobra.Command) string {
	return strings.ReplaceAll(c.CommandPath(), " ", "-")
}

func section(b *bytes.Buffer, c *cobra.Command) {
	fmt.Fprintf(b, "\n## %s\n\n", c.CommandPath())
	if c.Short != "" {
		b.WriteString(c.Short + ".\n\n")
	}
	fmt.Fprintf(b, "```\n%s\n```\n\n", c.UseLine())
	if len(c.Aliases) > 0 {
		fmt.Fprintf(b, "Aliases: %s\n\n", strings.Join(c.Aliases, ", "))
	}
	if c.Long != "" {
		b.WriteString(strings.TrimSpace(c.Long) + "\n\n")
	}
	if c.Example != "" {
		fmt.Fprintf(b, "Examples:\n\n```\n%s\n```\n\n", strings.TrimRight(c.Example, "\n"))
	}
	var subs []string
	for _, s := range c.Commands() {
		if !s.Hidden && s.Deprecated == "" {
			subs = append(subs, fmt.Sprintf("[`%s`](#%s)", s.Name(), anchor(s)))
		}
	}
	if len(subs) > 0 {
		fmt.Fprintf(b, "Subcommands: %s\n\n", strings.Join(subs, ", "))
	}
	if c.HasParent() && c.HasAvailableLocalFlags() {
		b.WriteString("Flags:\n\n")
		writeFlags(b, c.LocalNonPersistentFlags())
	}
}

func writeFlags(b *bytes.Buffer, fs *pflag.FlagSet) {
	b.WriteString("| flag | default | meaning |\n| --- | --- | --- |\n")
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Name == "help" {
			return
		}
		name := "`--" + f.Name + "`"
		if f.Shorthand != "" {
			name = "`-" + f.Shorthand + "`, " + name
		}
		def := f.DefValue
		switch {
		case def == "" || def == "[]":
			def = ""
		default:
			def = "`" + def + "`"
		}
		usage := strings.ReplaceAll(f.Usage, "|", "\\|")
		if f.Deprecated != "" {
			usage += " (deprecated: " + f.Deprecated + ")"
		}
		fmt.Fprintf(b, "| %s | %s | %s |\n", name, def, usage)
	})
	b.WriteString("\n")
}
