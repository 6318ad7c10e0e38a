package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/relaymesh/relaymesh/audit"
)

const auditSynopsis = `verify FILE: check every line of the hash-chained audit log; any edit,
  deletion, insertion or reordering is reported with its line number. Prints
  the record count and head hash: keep them elsewhere to detect truncation.`

func runAudit(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "verify" {
		fmt.Fprintf(stderr, "Usage: relaymesh audit verify FILE\n\n%s\n", auditSynopsis)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return nil
		}
		return fmt.Errorf("%w: want verify", errUsage)
	}
	fs := newFlags("audit verify FILE", auditSynopsis, stderr)
	pos, err := parse(fs, args[1:], 1)
	if err != nil {
		return err
	}
	f, err := os.Open(pos[0])
	if err != nil {
		return err
	}
	defer f.Close()
	sum, err := audit.Verify(f)
	if err != nil {
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	fmt.Fprintf(stdout, "%s: %d records verified, head %s", pos[0], sum.Records, sum.HeadHash)
	if sum.Records > 0 {
		fmt.Fprintf(stdout, ", %s .. %s", sum.First.Format(time.RFC3339), sum.Last.Format(time.RFC3339))
	}
	fmt.Fprintln(stdout)
	return nil
}
