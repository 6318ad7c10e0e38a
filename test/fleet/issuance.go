package fleet

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/test/localcluster"
)

// Issuance back ends.
const (
	BackendRelaymesh   = "relaymesh"        // Identity.Renew through the server under test
	BackendCfssl       = "cfssl"            // cfssl serve, through ca/cfsslca
	BackendStepCA      = "step-ca"          // step-ca without a database
	BackendStepCABadge = "step-ca-badgerv2" // step-ca with the database `step ca init` sets up
	BackendX509        = "x509"             // x509.CreateCertificate in this process
)

// IssuanceConfig compares certificate issuance: the server's Identity.Renew
// over established mTLS sessions, `cfssl serve` and step-ca signing the same
// certificate requests through the project's clients for them, and a bare
// x509.CreateCertificate, at the same concurrencies in one run.
type IssuanceConfig struct {
	Options
	// Concurrency levels; default 1, 4, 16.
	Concurrency []int
	// Duration of each measured window; default 10s. Warmup before each;
	// default 1s.
	Duration, Warmup time.Duration
	// CSRs is the size of the pool of P-256 requests every back end signs;
	// default 256.
	CSRs int
	// Backends to run, in order; default all five.
	Backends []string
	// ToolsDir holds cfssl and step-ca; default .cache/bin.
	ToolsDir string
	// StatusAfter is how long after the last relaymesh level the
	// KubernetesCluster statuses are compared; default 5s.
	StatusAfter time.Duration
}

// IssuanceRow is one back end at one concurrency.
type IssuanceRow struct {
	Backend     string
	Concurrency int
	// Certs issued and Errors in the window of Wall time.
	Certs, Errors int
	Wall          time.Duration
	PerSecond     float64
	// CACPU is the CPU the CA's process used in the window (for x509, this
	// process); CPUPerCert that per certificate. HarnessCPUPerCert is this
	// process's (the clients').
	CACPU                         time.Duration
	CPUPerCert, HarnessCPUPerCert time.Duration
	// LogLinesPerCert, Logs and APIRequestsPerCert: the server's log lines
	// and management API requests in the window (relaymesh only).
	LogLinesPerCert    float64
	Logs               map[string]int
	APIRequestsPerCert map[string]float64
	FirstError         string
}

// IssuanceResult holds every row, and the relaymesh server's audit check.
type IssuanceResult struct {
	Rows []IssuanceRow
	// StatusAfter compares, StatusAfter after the last relaymesh level,
	// each KubernetesCluster's status with the last certificate Renew gave
	// its agent (Correct: connected and naming it).
	StatusAfter StatusCheck
	// ServerArgs are the extra flags the relaymesh server ran with.
	ServerArgs   []string
	AuditRecords uint64
	Leaks        []string
}

// Issuance runs the comparison.
func Issuance(ctx context.Context, cfg IssuanceConfig) (*IssuanceResult, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if len(cfg.Concurrency) == 0 {
		cfg.Concurrency = []int{1, 4, 16}
	}
	if cfg.Duration == 0 {
		cfg.Duration = 10 * time.Second
	}
	if cfg.Warmup == 0 {
		cfg.Warmup = time.Second
	}
	if cfg.CSRs == 0 {
		cfg.CSRs = 256
	}
	if cfg.StatusAfter == 0 {
		cfg.StatusAfter = 5 * time.Second
	}
	if len(cfg.Backends) == 0 {
		cfg.Backends = []string{BackendRelaymesh, BackendCfssl, BackendStepCA, BackendStepCABadge, BackendX509}
	}
	if cfg.ToolsDir == "" {
		root, err := localcluster.RepoRoot()
		if err != nil {
			return nil, err
		}
		cfg.ToolsDir = filepath.Join(root, ".cache", "bin")
	}
	csrs := make([][]byte, cfg.CSRs)
	parsed := make([]*x509.CertificateRequest, cfg.CSRs)
	for i := range csrs {
		_, pemBytes, err := NewCSR()
		if err != nil {
			return nil, err
		}
		block, _ := pem.Decode(pemBytes)
		if parsed[i], err = x509.ParseCertificateRequest(block.Bytes); err != nil {
			return nil, err
		}
		csrs[i] = pemBytes
	}
	res := &IssuanceResult{}
	for _, b := range cfg.Backends {
		var rows []IssuanceRow
		var err error
		switch b {
		case BackendRelaymesh:
			rows, err = issueRelaymesh(ctx, &cfg, csrs, res)
		case BackendCfssl:
			var e *ExternalCA
			if e, err = StartCfssl(ctx, filepath.Join(cfg.ToolsDir, "cfssl"), filepath.Join(cfg.Env.Dir, "cfssl")); err == nil {
				rows, err = issueExternal(ctx, &cfg, e, parsed)
			}
		case BackendStepCA, BackendStepCABadge:
			db := strings.TrimPrefix(strings.TrimPrefix(b, BackendStepCA), "-")
			var e *ExternalCA
			if e, err = StartStepCA(ctx, filepath.Join(cfg.ToolsDir, "step-ca"), filepath.Join(cfg.Env.Dir, b), db); err == nil {
				rows, err = issueExternal(ctx, &cfg, e, parsed)
			}
		case BackendX509:
			rows, err = issueX509(ctx, &cfg, parsed)
		default:
			err = fmt.Errorf("unknown back end %q", b)
		}
		if err != nil {
			return nil, fmt.Errorf("issuance %s: %w", b, err)
		}
		res.Rows = append(res.Rows, rows...)
	}
	return res, nil
}

// window is one measured stretch of a load.
type window struct {
	certs, errors int
	wall          time.Duration
	cpu           CPUWindow
	from, to      time.Time
	firstErr      error
}

// load runs c workers calling issue in a loop: a warmup, then a measured
// window (completions, errors and CPU of pids counted between two
// instants), then it stops them.
func load(ctx context.Context, c int, warmup, dur time.Duration, pids map[string]int, issue func(ctx context.Context, worker, i int) error) (window, error) {
	var ok, bad atomic.Int64
	var firstErr atomic.Pointer[error]
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				if err := issue(ctx, w, i); err != nil {
					if ctx.Err() != nil {
						return
					}
					bad.Add(1)
					firstErr.CompareAndSwap(nil, &err)
					// Do not spin on a server that refuses.
					select {
					case <-ctx.Done():
						return
					case <-time.After(10 * time.Millisecond):
					}
					continue
				}
				ok.Add(1)
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	time.Sleep(warmup)
	meter, err := StartCPU(pids)
	if err != nil {
		return window{}, err
	}
	w := window{from: time.Now()}
	ok0, bad0 := ok.Load(), bad.Load()
	select {
	case <-ctx.Done():
		return window{}, ctx.Err()
	case <-time.After(dur):
	}
	ok1, bad1 := ok.Load(), bad.Load()
	w.to = time.Now()
	if w.cpu, err = meter.Stop(); err != nil {
		return window{}, err
	}
	w.certs, w.errors, w.wall = int(ok1-ok0), int(bad1-bad0), w.to.Sub(w.from)
	if p := firstErr.Load(); p != nil {
		w.firstErr = *p
	}
	return w, nil
}

func (w window) row(backend string, c int, caProc string) IssuanceRow {
	r := IssuanceRow{Backend: backend, Concurrency: c, Certs: w.certs, Errors: w.errors, Wall: w.wall,
		PerSecond: float64(w.certs) / w.wall.Seconds(), CACPU: w.cpu.CPU[caProc]}
	if w.certs > 0 {
		r.CPUPerCert = r.CACPU / time.Duration(w.certs)
		r.HarnessCPUPerCert = w.cpu.CPU["harness"] / time.Duration(w.certs)
	}
	if w.firstErr != nil {
		r.FirstError = truncate(w.firstErr.Error(), 300)
	}
	return r
}

// issueRelaymesh renews through the server: one registered agent per
// worker, each sending Identity.Renew with requests from the pool over
// its open session; one answer in 16 is checked in full.
func issueRelaymesh(ctx context.Context, cfg *IssuanceConfig, csrs [][]byte, res *IssuanceResult) ([]IssuanceRow, error) {
	// A server with a per-cluster renewal budget (--cluster-renewals-per-
	// minute, after a44b94c) would measure the budget, not issuance: lift
	// it for this measurement, and say so in the result.
	opts := cfg.Options
	if serverHasFlag(cfg.Env.Binary, renewalBudgetFlag) {
		opts.ServerArgs = append(append([]string(nil), opts.ServerArgs...), "--"+renewalBudgetFlag+"=1000000")
	}
	// So is each authenticated connection's stream budget (50/s: what an
	// HTTP/2 rapid-reset flood meets), which Renew at full speed over one
	// session exceeds.
	if serverHasFlag(cfg.Env.Binary, streamBudgetFlag) {
		opts.ServerArgs = append(opts.ServerArgs, "--"+streamBudgetFlag+"=1000000")
	}
	res.ServerArgs = opts.ServerArgs
	srv, err := opts.startServer(ctx, "issuance-server")
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	members, _, _, err := cfg.registerFleet(ctx, "issue", slices.Max(cfg.Concurrency))
	if err != nil {
		return nil, err
	}
	roots, err := cfg.Env.Mgmt.RelayRoots(ctx)
	if err != nil {
		return nil, err
	}
	f, err := NewFleet(FleetConfig{Servers: []string{srv.Addr}, Roots: roots, Members: members})
	if err != nil {
		return nil, err
	}
	defer f.Stop()
	f.Start(ctx)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = f.Wait(wctx, "connected", Connected)
	cancel()
	if err != nil {
		return nil, err
	}
	agents := f.Agents()
	// The last certificate issued to each agent, to compare with status.
	last := make([]atomic.Pointer[[]byte], len(agents))
	var rows []IssuanceRow
	for _, c := range cfg.Concurrency {
		apiBefore, err := cfg.Env.Mgmt.APIRequests(ctx)
		if err != nil {
			return nil, err
		}
		stop := cfg.during(ctx, srv)
		w, err := load(ctx, c, cfg.Warmup, cfg.Duration, map[string]int{"server": srv.Pid(), "harness": 0}, func(ctx context.Context, worker, i int) error {
			a := agents[worker]
			resp, err := a.RenewCSR(ctx, csrs[(worker*7919+i)%len(csrs)])
			if err != nil {
				return err
			}
			chain := resp.GetCertificateChain()
			last[worker].Store(&chain)
			if i%16 == 0 {
				return CheckCertificate(pemChain(resp.GetCertificateChain()), roots, a.Cluster(), time.Now())
			}
			if len(resp.GetCertificateChain()) == 0 {
				return errors.New("empty certificate chain")
			}
			return nil
		})
		stop()
		if err != nil {
			return nil, err
		}
		apiAfter, err := cfg.Env.Mgmt.APIRequests(ctx)
		if err != nil {
			return nil, err
		}
		row := w.row(BackendRelaymesh, c, "server")
		lines, err := linesBetween(srv, w.from, w.to)
		if err != nil {
			return nil, err
		}
		row.Logs = LogCounts(lines)
		row.APIRequestsPerCert = map[string]float64{}
		if w.certs > 0 {
			row.LogLinesPerCert = float64(len(lines)) / float64(w.certs)
			for k, v := range subAPI(apiAfter, apiBefore) {
				row.APIRequestsPerCert[k] = v / float64(w.certs)
			}
		}
		cfg.Logf("issuance: relaymesh at %d: %.0f certs/s, %s CPU per cert", c, row.PerSecond, row.CPUPerCert)
		rows = append(rows, row)
	}
	// After Renew at full speed, does every KubernetesCluster name the
	// last certificate issued to its agent?
	time.Sleep(cfg.StatusAfter)
	statuses, err := cfg.Env.Mgmt.ClusterStatuses(ctx)
	if err != nil {
		return nil, err
	}
	res.StatusAfter = StatusCheck{After: cfg.StatusAfter}
	// The last certificate issued per cluster, from the server's audit
	// log: a Renew the harness gave up on when its window closed may
	// still have been issued, and status must name that one.
	issued, err := srv.LastIssued()
	if err != nil {
		return nil, err
	}
	for i, a := range agents {
		if last[i].Load() == nil {
			continue
		}
		res.StatusAfter.Total++
		st := statuses[a.Cluster()]
		if !st.HasStatus {
			res.StatusAfter.NoStatus++
		}
		if st.Connected {
			res.StatusAfter.Connected++
		}
		if want := issued[a.Cluster()]; want != "" && st.Serial == want {
			res.StatusAfter.SerialMatches++
			if st.Connected {
				res.StatusAfter.Correct++
			}
		} else {
			cfg.Logf("issuance: %s's status names serial %s, the last certificate issued to it is %s", a.Cluster(), st.Serial, want)
		}
	}
	cfg.Logf("issuance: %s after the last Renew, %d of %d statuses name the last certificate issued", cfg.StatusAfter, res.StatusAfter.SerialMatches, res.StatusAfter.Total)
	f.Stop()
	if res.AuditRecords, err = srv.VerifyAudit(); err != nil {
		return nil, fmt.Errorf("audit log of the issuance server: %w", err)
	}
	if res.Leaks, err = srv.FindSecrets(members); err != nil {
		return nil, err
	}
	return rows, nil
}

// renewalBudgetFlag is the server flag that bounds renewals per cluster.
const renewalBudgetFlag = "cluster-renewals-per-minute"

// streamBudgetFlag is the server flag that bounds the streams one
// authenticated connection may open per second.
const streamBudgetFlag = "connection-streams-per-second"

// serverHasFlag reports whether `bin server --help` lists flag.
func serverHasFlag(bin, flag string) bool {
	out, _ := exec.Command(bin, "server", "--help").CombinedOutput()
	return strings.Contains(string(out), "-"+flag+" ")
}

// pemChain decodes a PEM chain into DER certificates.
func pemChain(b []byte) [][]byte {
	var out [][]byte
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return out
		}
		out = append(out, block.Bytes)
	}
}

// agentTemplate is the certificate the Authority asks a signer for when it
// issues cluster's agent certificate (ca.Authority.IssueAgentFor).
func agentTemplate(cluster string, now time.Time) *x509.Certificate {
	return &x509.Certificate{
		Subject:               pkix.Name{Organization: []string{"relaymesh"}, OrganizationalUnit: []string{"fleet-registration"}},
		URIs:                  []*url.URL{{Scheme: "spiffe", Host: "relaymesh.local", Path: "/cluster/" + cluster + "/agent"}},
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(24 * time.Hour),
	}
}

// issueExternal has a third-party CA sign the pool's requests with the
// agent template; one certificate in 16 is checked.
func issueExternal(ctx context.Context, cfg *IssuanceConfig, e *ExternalCA, csrs []*x509.CertificateRequest) ([]IssuanceRow, error) {
	defer e.Stop()
	var rows []IssuanceRow
	for _, c := range cfg.Concurrency {
		w, err := load(ctx, c, cfg.Warmup, cfg.Duration, map[string]int{e.Name: e.Pid(), "harness": 0}, func(ctx context.Context, worker, i int) error {
			cluster := fmt.Sprintf("issue-%d", worker)
			csr := csrs[(worker*7919+i)%len(csrs)]
			cert, err := e.Signer.SignRequest(ctx, agentTemplate(cluster, time.Now()), csr)
			if err != nil {
				return err
			}
			if i%16 == 0 {
				return checkSigned(cert, csr.PublicKey, cluster)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		row := w.row(e.Name, c, e.Name)
		cfg.Logf("issuance: %s at %d: %.0f certs/s, %s CPU per cert", e.Name, c, row.PerSecond, row.CPUPerCert)
		rows = append(rows, row)
	}
	return rows, nil
}

// checkSigned checks that cert is for pub and names cluster's agent, for
// clientAuth only.
func checkSigned(cert *x509.Certificate, pub crypto.PublicKey, cluster string) error {
	k, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !k.Equal(pub) {
		return errors.New("certificate is not for the request's key")
	}
	if len(cert.URIs) != 1 || cert.URIs[0].String() != "spiffe://relaymesh.local/cluster/"+cluster+"/agent" {
		return fmt.Errorf("certificate names %v", cert.URIs)
	}
	if !slices.Equal(cert.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) || cert.IsCA {
		return errors.New("certificate is not a clientAuth leaf")
	}
	return nil
}

// issueX509 signs the same template with x509.CreateCertificate and an
// ECDSA P-256 issuing key in this process: the floor any CA pays.
func issueX509(ctx context.Context, cfg *IssuanceConfig, csrs []*x509.CertificateRequest) ([]IssuanceRow, error) {
	rc, err := ca.GenerateRelayCA(ca.GenerateConfig{Org: "fleet x509"})
	if err != nil {
		return nil, err
	}
	var rows []IssuanceRow
	for _, c := range cfg.Concurrency {
		w, err := load(ctx, c, cfg.Warmup, cfg.Duration, map[string]int{"harness": 0}, func(ctx context.Context, worker, i int) error {
			tmpl := agentTemplate(fmt.Sprintf("issue-%d", worker), time.Now())
			serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
			if err != nil {
				return err
			}
			tmpl.SerialNumber = serial
			csr := csrs[(worker*7919+i)%len(csrs)]
			_, err = x509.CreateCertificate(rand.Reader, tmpl, rc.Issuer, csr.PublicKey, rc.IssuerKey)
			return err
		})
		if err != nil {
			return nil, err
		}
		rows = append(rows, w.row(BackendX509, c, "harness"))
	}
	return rows, nil
}
