// Command relaymesh is Relaymesh's single binary. Today it only reports its
// version; `server`, `agent`, `cluster`, `token`, `ca`, `policy`, `check`,
// `describe` and `debug` arrive with the issues that build them (see the
// README's table of what works).
package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
)

const usage = `relaymesh: multi-cluster trust and federation for Istio meshes

Usage:
  relaymesh version    print the version
  relaymesh help       show this help

The server, agent and admin commands are not built yet; see README.md.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "version":
		fmt.Fprintln(stdout, "relaymesh", version())
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "relaymesh: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

// version is the module version, or the VCS revision for a source build.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			return "devel+" + s.Value
		}
	}
	return "devel"
}
