package fleet

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/relaymesh/relaymesh/audit"
)

// VerifyAudit checks the server's hash-chained audit log (audit.Verify)
// and returns how many records it holds.
func (s *Server) VerifyAudit() (uint64, error) {
	f, err := os.Open(s.AuditPath())
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sum, err := audit.Verify(f)
	if err != nil {
		return 0, err
	}
	return sum.Records, nil
}

// FindSecrets reports where any of the members' tokens (whole, or their
// secret half) or any PEM private key appears in the server's log or audit
// log. The report names the cluster and the file, never the secret. Every
// run of base64url characters in the logs is looked up in the set of the
// members' secrets, so the cost is one pass over the logs, whatever the
// fleet's size.
func (s *Server) FindSecrets(members []Member) ([]string, error) {
	return FindSecretsIn([]string{s.LogPath(), s.AuditPath()}, members)
}

// FindSecretsIn is FindSecrets over any files.
func FindSecretsIn(paths []string, members []Member) ([]string, error) {
	owner := make(map[string]string, len(members))
	for _, m := range members {
		if _, secret, ok := strings.Cut(m.Token, "."); ok && secret != "" {
			owner[secret] = m.Cluster
		}
	}
	var found []string
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		if bytes.Contains(b, []byte("PRIVATE KEY")) {
			found = append(found, fmt.Sprintf("a PEM private key in %s", path))
		}
		seen := map[string]bool{}
		for _, run := range base64urlRuns.FindAll(b, -1) {
			// A secret may sit inside a longer run (e.g. a whole token's
			// neighbours): check every window of a secret's length.
			for i := 0; i+tokenSecretLen <= len(run); i++ {
				if c, ok := owner[string(run[i:i+tokenSecretLen])]; ok && !seen[c] {
					seen[c] = true
					found = append(found, fmt.Sprintf("the token of %s in %s", c, path))
				}
			}
		}
	}
	return found, nil
}

// tokenSecretLen is the length of a token's secret half (32 bytes as
// unpadded base64url); base64urlRuns finds the runs that may hold one.
const tokenSecretLen = 43

var base64urlRuns = regexp.MustCompile(`[A-Za-z0-9_-]{43,}`)

// Hygiene is what every scenario checks at its end, with its agents
// stopped: the server's audit chain verifies, and no token or private key
// appears in its logs.
type Hygiene struct {
	AuditRecords uint64
	Leaks        []string
}

// CheckHygiene verifies the audit log and searches the logs for the
// members' secrets.
func (s *Server) CheckHygiene(members []Member) (Hygiene, error) {
	n, err := s.VerifyAudit()
	if err != nil {
		return Hygiene{}, fmt.Errorf("audit log %s: %w", s.AuditPath(), err)
	}
	leaks, err := s.FindSecrets(members)
	if err != nil {
		return Hygiene{}, err
	}
	return Hygiene{AuditRecords: n, Leaks: leaks}, nil
}

// LastIssued reads the server's audit log: the serial of the last
// certificate issued or renewed for each cluster. It is what status must
// name: a Renew the harness gave up on at the end of a window may still
// have been issued.
func (s *Server) LastIssued() (map[string]string, error) {
	b, err := os.ReadFile(s.AuditPath())
	if err != nil {
		return nil, err
	}
	last := map[string]string{}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var r audit.Record
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("audit log %s: %w", s.AuditPath(), err)
		}
		if (r.Type == audit.CertIssue || r.Type == audit.CertRenew) && r.Result == audit.ResultSuccess && r.Serial != "" {
			last[r.Cluster] = r.Serial
		}
	}
	return last, nil
}
