package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/relaymesh/relaymesh/audit"
	"github.com/spf13/cobra"
)

const auditSynopsis = `verify FILE...: check every line of the hash-chained audit log; any edit,
  deletion, insertion or reordering is reported with its line number. Prints
  the record count and head hash: keep them elsewhere to detect truncation.
  With several files (one per server replica: each replica keeps its own
  chain), each is verified on its own, the same chain given twice is
  refused, and the exit status is non-zero if any chain is broken.`

func newAuditCommand(d deps, _ *globals) *cobra.Command {
	verify := &cobra.Command{
		Use:   "verify FILE...",
		Short: "Verify the hash-chained audit log (one file per server replica)",
		Long:  auditSynopsis,
		Example: `  relaymesh audit verify /var/log/relaymesh/audit.log
  # the logs of three server replicas, copied out of their pods
  relaymesh audit verify audit-0.log audit-1.log audit-2.log`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("give at least one audit log FILE")
			}
			return nil
		},
		RunE: func(_ *cobra.Command, args []string) error {
			return verifyAuditLogs(d.stdout, args)
		},
	}
	return groupCommand("audit", "Verify the hash-chained audit log", auditSynopsis, "  relaymesh audit verify audit.log", verify)
}

// verifyAuditLogs verifies each file as a chain of its own and, with
// several, says what they prove together.
func verifyAuditLogs(stdout io.Writer, paths []string) error {
	var errs []error
	var total uint64
	var first, last time.Time
	heads := map[string]string{}
	for _, path := range paths {
		sum, err := verifyAuditLog(stdout, path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if sum.Records > 0 {
			if other, ok := heads[sum.HeadHash]; ok {
				errs = append(errs, fmt.Errorf("%s: the same chain as %s (a copy, not another replica's log)", path, other))
				continue
			}
			heads[sum.HeadHash] = path
			if first.IsZero() || sum.First.Before(first) {
				first = sum.First
			}
			if sum.Last.After(last) {
				last = sum.Last
			}
		}
		total += sum.Records
	}
	if len(paths) > 1 {
		fmt.Fprintf(stdout, "%d of %d chains verified, each on its own (every replica chains its own records; records of different replicas are not chained to each other): %d records", len(paths)-len(errs), len(paths), total)
		if total > 0 {
			fmt.Fprintf(stdout, ", %s .. %s", first.Format(time.RFC3339), last.Format(time.RFC3339))
		}
		fmt.Fprintln(stdout)
	}
	return errors.Join(errs...)
}

func verifyAuditLog(stdout io.Writer, path string) (audit.Summary, error) {
	f, err := os.Open(path)
	if err != nil {
		return audit.Summary{}, err
	}
	defer f.Close()
	sum, err := audit.Verify(f)
	if err != nil {
		return audit.Summary{}, fmt.Errorf("%s: %w", path, err)
	}
	fmt.Fprintf(stdout, "%s: %d records verified, head %s", path, sum.Records, sum.HeadHash)
	if sum.Records > 0 {
		fmt.Fprintf(stdout, ", %s .. %s", sum.First.Format(time.RFC3339), sum.Last.Format(time.RFC3339))
	}
	fmt.Fprintln(stdout)
	return sum, nil
}
