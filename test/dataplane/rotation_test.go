package dataplane_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/test/dataplane"
	"github.com/relaymesh/relaymesh/test/istiod"
	"github.com/relaymesh/relaymesh/trust"
)

// rollbacks says from which phases the rotation test rolls a rotation
// back. `make test` rolls back from DeletingOldRoot, the hardest: the old
// root comes back into the bundles, intermediates are switched back to it
// and the new root leaves the bundles last, each step held (Manual
// verification) until both clusters adopted it and every connection
// renewed. It passes through every step the other rollbacks take, so it
// replaces the one from AddingNewRoot. `make test-rotation` passes
// -dataplane.rollbacks=all.
var rollbacks = flag.String("dataplane.rollbacks", "DeletingOldRoot",
	`phases to roll a rotation back from: comma-separated of AddingNewRoot, PropagatingNewIntermediate, DeletingOldRoot, or "all"`)

// Load of the rotation test: each direction at rotationRate RPCs a second
// to the other cluster's ping server, which ends every connection after
// about pingConnectionAge (so clients handshake again).
const (
	rotationRate    = 250
	minRate         = 200
	rotationWorkers = 16
	// afterRenew is how long after new certificate files every connection
	// of the load uses them: gRPC rereads the files every DefaultRefresh
	// (one more is slack for a reread that a loaded machine runs late),
	// and servers end connections within 1.1 pingConnectionAge (gRPC's
	// jitter).
	afterRenew = 2*dataplane.DefaultRefresh + pingConnectionAge*11/10 + 300*time.Millisecond
	// verifyFor is how long each phase's traffic is checked once it
	// settled.
	verifyFor = 750 * time.Millisecond
)

// follower keeps each cluster's istiod and workloads on the cacerts its
// agent writes, as autoRestartPods or an operator would: whenever the
// Secret changes, it restarts that cluster's istiod on it and re-issues
// that cluster's workloads' certificates.
type follower struct {
	fed    *federation
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	adopted map[string]string // cluster → resourceVersion of the cacerts in use
	events  []adoption
	err     error
	// check, when set, runs after every adoption, with both clusters as
	// they are at that moment; its results are in checks.
	check  func(ctx context.Context) error
	checks []error
}

// adoption is one cluster taking one version of its cacerts.
type adoption struct {
	cluster         string
	at              time.Time
	restart, renew  time.Duration
	roots           int
	intermediateKey string
}

func (fed *federation) follow(t *testing.T) *follower {
	ctx, cancel := context.WithCancel(context.Background())
	fl := &follower{fed: fed, cancel: cancel, adopted: map[string]string{}}
	for c, m := range fed.meshes {
		fl.adopted[c] = m.version
	}
	for _, c := range []string{"cluster-1", "cluster-2"} {
		fl.wg.Go(func() { fl.run(ctx, c) })
	}
	t.Cleanup(fl.stop)
	return fl
}

func (fl *follower) stop() {
	fl.cancel()
	fl.wg.Wait()
}

func (fl *follower) run(ctx context.Context, cluster string) {
	for ctx.Err() == nil {
		m, err := fl.fed.readMesh(ctx, cluster)
		fl.mu.Lock()
		current := fl.adopted[cluster]
		fl.mu.Unlock()
		if err == nil && m.version != current {
			err = fl.adopt(ctx, cluster, m)
		}
		if err != nil && ctx.Err() == nil {
			fl.mu.Lock()
			fl.err = err
			fl.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (fl *follower) adopt(ctx context.Context, cluster string, m mesh) error {
	start := time.Now()
	c := fl.fed.f.env.Cluster(cluster)
	if _, err := c.RestartIstiod(ctx, m.cacerts); err != nil {
		return err
	}
	restarted := time.Now()
	for _, w := range fl.fed.f.workloadsOf(cluster) {
		if err := w.RenewCertificate(ctx); err != nil {
			return err
		}
	}
	fl.mu.Lock()
	fl.adopted[cluster] = m.version
	fl.fed.meshes[cluster] = m
	fl.events = append(fl.events, adoption{cluster: cluster, at: start, restart: restarted.Sub(start), renew: time.Since(restarted),
		roots: len(m.roots), intermediateKey: m.issuer()})
	check := fl.check
	fl.mu.Unlock()
	if check != nil {
		err := check(ctx)
		if err != nil {
			err = fmt.Errorf("after %s adopted its cacerts %s: %w", cluster, m.version, err)
		}
		fl.mu.Lock()
		fl.checks = append(fl.checks, err)
		fl.mu.Unlock()
	}
	return nil
}

// setCheck sets the check run after every adoption and returns the
// results of the one it replaces.
func (fl *follower) setCheck(check func(ctx context.Context) error) []error {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	out := fl.checks
	fl.check, fl.checks = check, nil
	return out
}

// meshes is what both clusters run on now.
func (fl *follower) meshes() map[string]mesh {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	out := map[string]mesh{}
	for c, m := range fl.fed.meshes {
		out[c] = m
	}
	return out
}

// caughtUp waits until both clusters run on the cacerts their Secrets hold
// now, and returns their meshes.
func (fl *follower) caughtUp(t *testing.T) map[string]mesh {
	t.Helper()
	ctx := context.Background()
	out := map[string]mesh{}
	fl.fed.waitFor(t, "istiods and workloads on the current cacerts", func() (bool, string) {
		fl.mu.Lock()
		err := fl.err
		fl.mu.Unlock()
		if err != nil {
			return false, err.Error()
		}
		for _, c := range []string{"cluster-1", "cluster-2"} {
			m, err := fl.fed.readMesh(ctx, c)
			if err != nil {
				return false, err.Error()
			}
			fl.mu.Lock()
			ok := fl.adopted[c] == m.version
			fl.mu.Unlock()
			if !ok {
				return false, c + " not yet"
			}
			out[c] = m
		}
		return true, ""
	})
	return out
}

// workloadsOf are the fixture's workloads in cluster.
func (f *fixture) workloadsOf(cluster string) []*dataplane.Workload {
	if cluster == "cluster-1" {
		return []*dataplane.Workload{f.v1, f.v2, f.sleep, f.other, f.ping1}
	}
	return []*dataplane.Workload{f.v3, f.sleep2, f.ping2}
}

// rotation drives `relaymesh ca rotate` and the load through the phases.
type rotation struct {
	t    *testing.T
	fed  *federation
	fl   *follower
	load *dataplane.Load
	// phases are the timings of every phase, in order.
	phases []phaseTiming
}

type phaseTiming struct {
	name                  string
	command, adopt, total time.Duration
	step                  string
}

const (
	pingOfCluster1 = "ping.apps.svc.cluster-1.global"
	pingOfCluster2 = "ping.apps.svc.cluster-2.global"
	flow12         = "cluster-1 → cluster-2"
	flow21         = "cluster-2 → cluster-1"
)

// checkRotationUnderLoad: RPCs flow both ways between the clusters, every
// connection re-handshaking within a second, while `relaymesh ca rotate`
// moves the VirtualMesh to a new root (Manual verification: at each phase
// both istiods restart on the agents' cacerts and every workload gets a new
// certificate before the rotation continues). No RPC fails. Then rotations
// are rolled back from the phases -dataplane.rollbacks names, and a broken
// rotation (a new root pushed to one mesh before the other trusts it)
// fails RPCs in the same harness.
func (fed *federation) checkRotationUnderLoad(t *testing.T) {
	f := fed.f
	for _, dir := range []struct {
		from *dataplane.Workload
		host string
	}{{f.sleep, pingOfCluster2}, {f.sleep2, pingOfCluster1}} {
		c, err := dir.from.DialHost(dir.host, echoPort)
		require.NoError(t, err)
		f.settle(t, c, dir.host+" answers", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Code(codes.OK) == o.Total() })
		require.NoError(t, c.Close())
	}
	fl := fed.follow(t)
	load, err := dataplane.StartLoad("before", dataplane.LoadConfig{
		Flows: []dataplane.Flow{
			{Name: flow12, From: f.sleep, Host: pingOfCluster2, Port: echoPort},
			{Name: flow21, From: f.sleep2, Host: pingOfCluster1, Port: echoPort},
		},
		Rate: rotationRate, Workers: rotationWorkers,
	})
	require.NoError(t, err)
	stopped := false
	stop := func() []*dataplane.Segment {
		stopped = true
		return load.Stop()
	}
	t.Cleanup(func() {
		if !stopped {
			load.Stop()
		}
	})
	rot := &rotation{t: t, fed: fed, fl: fl, load: load}
	time.Sleep(afterRenew)
	rot.verify("before")
	oldRoots := fl.meshes()["cluster-1"].roots

	// The rotation, phase by phase.
	begin := time.Now()
	rot.phase("AddingNewRoot", "start", "AddingNewRoot step 1 (awaiting continue)", 2)
	rot.phase("PropagatingNewIntermediate", "continue", "PropagatingNewIntermediate step 2 (awaiting continue)", 2)
	rot.phase("DeletingOldRoot", "continue", "DeletingOldRoot step 3 (awaiting continue)", 1)
	rot.phase("Finished", "continue", "Finished step 3", 1)
	rotationTook := time.Since(begin)
	for c, m := range fl.meshes() {
		for _, r := range m.roots {
			for _, old := range oldRoots {
				assert.False(t, r.Equal(old), "%s's bundle still holds the old root after Finished", c)
			}
		}
	}

	// Rollbacks.
	for _, from := range rollbackPhases(t) {
		rot.rollbackFrom(from)
	}

	// A CrossSigned rotation: one root in every bundle at every step.
	rot.crossSigned()

	// A broken rotation: cluster-2 gets an intermediate of a root cluster-1
	// does not trust yet (pushed before the bundle).
	rot.broken()
	segs := stop()

	// Report and judge.
	rot.report(segs, rotationTook)
	byName := map[string]*dataplane.Outcomes{}
	var order []string
	for _, s := range segs {
		phase, _, _ := strings.Cut(s.Name, ": ")
		if byName[phase] == nil {
			byName[phase] = dataplane.NewOutcomes()
			order = append(order, phase)
		}
		byName[phase].Merge(s.Total())
	}
	forwardRPCs, forwardFailed := 0, 0
	for _, p := range forwardPhases {
		require.NotNil(t, byName[p], p)
		forwardRPCs += byName[p].Total()
		forwardFailed += byName[p].Failed()
	}
	t.Logf("rotation under load: %d RPCs across the rotation (both directions, %d/s each targeted), %d failed; the rotation took %s",
		forwardRPCs, rotationRate, forwardFailed, rotationTook.Round(time.Millisecond))
	assert.Zero(t, forwardFailed, "no RPC fails while the root rotates")
	for _, s := range segs {
		phase, _, _ := strings.Cut(s.Name, ": ")
		if slices.Contains(forwardPhases, phase) || phase == "before" {
			assert.Zero(t, s.Total().Failed(), "segment %q: %s", s.Name, s.Total())
		}
	}
	for _, p := range order {
		if strings.HasPrefix(p, "rollback") || strings.HasPrefix(p, crossSignedPhase) {
			o := byName[p]
			t.Logf("%s: %d RPCs, %d failed", p, o.Total(), o.Failed())
			assert.Zero(t, o.Failed(), "%s: no RPC fails: %s", p, o)
		}
	}
	broken := byName["broken"]
	require.NotNil(t, broken)
	assert.Positive(t, broken.ErrorsWith("certificate"), "the broken rotation fails handshakes: %s", broken)
	// (Back on the agent's cacerts, "restored: settled" was checked by
	// verify: the failures of the broken push end once both sides hold
	// certificates of one root again.)

	// The load kept its rate through the rotation, in both directions.
	var during time.Duration
	counts := map[string]int{}
	for _, s := range segs {
		phase, _, _ := strings.Cut(s.Name, ": ")
		if !slices.Contains(forwardPhases, phase) {
			continue
		}
		during += s.Duration()
		for flow, o := range s.Flows {
			counts[flow] += o.Total()
		}
	}
	for _, flow := range []string{flow12, flow21} {
		rate := float64(counts[flow]) / during.Seconds()
		t.Logf("%s: %d RPCs in %s of rotation: %.0f/s", flow, counts[flow], during.Round(time.Millisecond), rate)
		assert.GreaterOrEqual(t, rate, float64(minRate), "%s: RPCs a second through the rotation", flow)
	}
}

// forwardPhases are the phases of the rotation from start to Finished.
var forwardPhases = []string{"AddingNewRoot", "PropagatingNewIntermediate", "DeletingOldRoot", "Finished"}

func rollbackPhases(t *testing.T) []string {
	all := []string{"AddingNewRoot", "PropagatingNewIntermediate", "DeletingOldRoot"}
	if *rollbacks == "all" {
		return all
	}
	var out []string
	for _, p := range strings.Split(*rollbacks, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		require.Contains(t, all, p, "-dataplane.rollbacks")
		out = append(out, p)
	}
	return out
}

// phase runs `ca rotate <verb> --wait`, expects it to end with want, lets
// the follower bring both clusters onto the new cacerts, waits until every
// connection of the load uses the new certificates, and checks the
// traffic of the settled phase. Its load segments are named "<name>: …".
func (rot *rotation) phase(name, verb, want string, wantRoots int) {
	t, r := rot.t, rot.fed.r
	start := time.Now()
	rot.load.Mark(name + ": control plane")
	out, err := r.run(context.Background(), "ca", "rotate", verb, vmKey, "--kubeconfig", r.mgmt.Kubeconfig, "--wait", "60s")
	require.NoError(t, err, out)
	require.Contains(t, out, want, "ca rotate %s:\n%s", verb, out)
	command := time.Since(start)
	rot.load.Mark(name + ": istiods and certificates")
	meshes := rot.fl.caughtUp(t)
	adopt := time.Since(start) - command
	for c, m := range meshes {
		assert.Len(t, m.roots, wantRoots, "%s: %s's root-cert.pem", name, c)
	}
	rot.load.Mark(name + ": connections renewing")
	time.Sleep(afterRenew)
	rot.verify(name)
	rot.phases = append(rot.phases, phaseTiming{name: name, command: command, adopt: adopt, total: time.Since(start), step: lastLine(out)})
}

// verify marks a segment "<name>: settled" of verifyFor and checks it:
// every RPC answered, and every one made with certificates from the
// intermediates the meshes hold now (so every connection re-handshook).
func (rot *rotation) verify(name string) {
	t := rot.t
	rot.load.Mark(name + ": settled")
	time.Sleep(verifyFor)
	s := rot.load.Mark(name + ": verified")
	meshes := rot.fl.meshes()
	one, two := meshes["cluster-1"], meshes["cluster-2"]
	for flow, want := range map[string][2]mesh{flow12: {one, two}, flow21: {two, one}} {
		o := s.Flows[flow]
		require.Positive(t, o.Total(), "%s: %s: no traffic", name, flow)
		assert.Zero(t, o.Failed(), "%s: %s: %s", name, flow, o)
		assert.Equal(t, o.Total(), o.PeerIssuer(want[0].issuer()), "%s: %s: every client certificate from the caller's current intermediate: %s", name, flow, o)
		assert.Equal(t, o.Total(), o.ServerIssuer(want[1].issuer()), "%s: %s: every server certificate from the server's current intermediate: %s", name, flow, o)
	}
}

// rollbackFrom starts a rotation, takes it to phase from (waiting at each
// phase as forward), rolls it back and waits until every mesh is on the
// old root again and the traffic settled. Manual verification holds each
// step back as it holds the forward phases: at each, the test lets both
// clusters adopt it and every connection renew, checks the traffic, and
// runs `ca rotate continue`.
func (rot *rotation) rollbackFrom(from string) {
	t, r := rot.t, rot.fed.r
	steps := []struct{ name, verb, want string }{
		{"AddingNewRoot", "start", "AddingNewRoot step 1 (awaiting continue)"},
		{"PropagatingNewIntermediate", "continue", "PropagatingNewIntermediate step 2 (awaiting continue)"},
		{"DeletingOldRoot", "continue", "DeletingOldRoot step 3 (awaiting continue)"},
	}
	label := "rollback from " + from
	roots := map[string]int{"AddingNewRoot": 2, "PropagatingNewIntermediate": 2, "DeletingOldRoot": 1}
	for _, s := range steps {
		rot.phase(label+" / "+s.name, s.verb, s.want, roots[s.name])
		if s.name == from {
			break
		}
	}
	// The first step back is one below the phase's step.
	firstBack := map[string]int{"AddingNewRoot": 0, "PropagatingNewIntermediate": 1, "DeletingOldRoot": 2}
	verb := "rollback"
	for step := firstBack[from]; ; step-- {
		require.GreaterOrEqual(t, step, 0, "%s: more steps back than there are", label)
		name := fmt.Sprintf("%s / RollingBack step %d", label, step)
		start := time.Now()
		rot.load.Mark(name + ": control plane")
		out, err := r.run(context.Background(), "ca", "rotate", verb, vmKey, "--kubeconfig", r.mgmt.Kubeconfig, "--wait", "60s")
		require.NoError(t, err, out)
		command := time.Since(start)
		if strings.Contains(lastLine(out), "RolledBack") {
			meshes := rot.fl.caughtUp(t)
			adopt := time.Since(start) - command
			for c, m := range meshes {
				assert.Len(t, m.roots, 1, "%s: after the rollback %s holds the old root only", label, c)
			}
			rot.load.Mark(label + " → RolledBack: connections renewing")
			time.Sleep(afterRenew)
			rot.verify(label + " → RolledBack")
			rot.phases = append(rot.phases, phaseTiming{name: label + " → RolledBack", command: command, adopt: adopt, total: time.Since(start), step: lastLine(out)})
			return
		}
		// Held at a step back: both roots in every bundle (steps 2 and 1).
		require.Contains(t, lastLine(out), fmt.Sprintf("RollingBack step %d (awaiting continue)", step), "ca rotate %s:\n%s", verb, out)
		rot.load.Mark(name + ": istiods and certificates")
		meshes := rot.fl.caughtUp(t)
		adopt := time.Since(start) - command
		for c, m := range meshes {
			assert.Len(t, m.roots, 2, "%s: %s's root-cert.pem", name, c)
		}
		rot.load.Mark(name + ": connections renewing")
		time.Sleep(afterRenew)
		rot.verify(name)
		rot.phases = append(rot.phases, phaseTiming{name: name, command: command, adopt: adopt, total: time.Since(start), step: lastLine(out)})
		verb = "continue"
	}
}

// crossSignedPhase prefixes the phases of the CrossSigned rotation.
const crossSignedPhase = "CrossSigned"

// crossSigned rotates the root again with rotationStrategy CrossSigned,
// under the same load: every mesh's root-cert.pem holds one root at every
// phase, and after every istiod restart of the follower (so also while one
// cluster is a step ahead of the other) a ztunnel-style certificate request
// to each cluster's istiod returns a chain the other cluster's ztunnel,
// holding the single root of its own answer, accepts; both ways.
func (rot *rotation) crossSigned() {
	t, r := rot.t, rot.fed.r
	ctx := context.Background()
	setStrategy := func(s networkingv1alpha1.RotationStrategy) {
		_, err := r.dyn.Resource(virtualMeshesGVR).Namespace("relaymesh").Patch(ctx, vmName, types.MergePatchType,
			[]byte(`{"spec":{"mtls":{"rotationStrategy":"`+string(s)+`"}}}`), metav1.PatchOptions{})
		require.NoError(t, err)
	}
	setStrategy(networkingv1alpha1.RotationCrossSigned)
	t.Cleanup(func() { setStrategy(networkingv1alpha1.RotationMultiRoot) })
	rot.fl.setCheck(rot.ztunnelsAccept)
	for _, p := range []struct{ name, verb, want string }{
		{"AddingNewRoot", "start", "AddingNewRoot step 1 (awaiting continue)"},
		{"PropagatingNewIntermediate", "continue", "PropagatingNewIntermediate step 2 (awaiting continue)"},
		{"DeletingOldRoot", "continue", "DeletingOldRoot step 3 (awaiting continue)"},
		{"Finished", "continue", "Finished step 3"},
	} {
		rot.phase(crossSignedPhase+" "+p.name, p.verb, p.want, 1)
		require.NoError(t, rot.ztunnelsAccept(ctx), "%s: both clusters on it", p.name)
	}
	checks := rot.fl.setCheck(nil)
	require.NotEmpty(t, checks, "the follower restarted istiods during the rotation")
	for _, err := range checks {
		assert.NoError(t, err)
	}
	t.Logf("CrossSigned: %d ztunnel-style checks after istiod restarts, each of both istiods' answers against the other's single root", len(checks))
	setStrategy(networkingv1alpha1.RotationMultiRoot)
}

// ztunnelsAccept asks each cluster's istiod for a certificate as ztunnel
// does (its service account's token, a CSR; the answer read as ztunnel
// reads it), requires each answer to carry a single root, and checks that
// each cluster's certificate verifies against the other's root.
func (rot *rotation) ztunnelsAccept(ctx context.Context) error {
	f := rot.fed.f
	got := map[string]istiod.ZtunnelCertificate{}
	for cluster, w := range map[string]*dataplane.Workload{"cluster-1": f.sleep, "cluster-2": f.sleep2} {
		c := f.env.Cluster(cluster)
		rest, _ := strings.CutPrefix(w.SPIFFEID(), "spiffe://")
		parts := strings.Split(rest, "/") // <td>/ns/<ns>/sa/<sa>
		if len(parts) != 5 {
			return fmt.Errorf("%s: unexpected SPIFFE ID %q", w.Name(), w.SPIFFEID())
		}
		token, err := istiod.ServiceAccountToken(ctx, c.Kube(), parts[2], parts[4], istiod.TokenAudience)
		if err != nil {
			return err
		}
		_, csr, err := istiod.WorkloadCSR(w.SPIFFEID())
		if err != nil {
			return err
		}
		// The istiod may be replaced meanwhile (the follower restarts it):
		// a request the stopping one drops is asked again of the new one.
		var z istiod.ZtunnelCertificate
		for attempt := 0; ; attempt++ {
			if z, err = c.Istiod().ZtunnelCertificate(ctx, istiod.CertificateRequest{Token: token, CSR: csr}); err == nil || attempt == 4 {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", cluster, err)
		}
		if len(z.Roots) != 1 {
			return fmt.Errorf("%s's istiod answers with %d roots, not one", cluster, len(z.Roots))
		}
		got[cluster] = z
	}
	for _, pair := range [][2]string{{"cluster-1", "cluster-2"}, {"cluster-2", "cluster-1"}} {
		if err := got[pair[0]].VerifiedBy(got[pair[1]].Roots); err != nil {
			return fmt.Errorf("%s's certificate is refused by %s's ztunnel (root %s): %w", pair[0], pair[1], trust.ShortFingerprint(trust.Fingerprint(got[pair[1]].Roots[0])), err)
		}
	}
	return nil
}

// broken pushes cluster-2 an intermediate of a root cluster-1 does not
// trust (cluster-2's own bundle has both), as a rotation that published the
// new intermediate before the bundle would: both directions fail. Then
// cluster-2 is put back on its agent's cacerts.
func (rot *rotation) broken() {
	t, f := rot.t, rot.fed.f
	ctx := context.Background()
	rot.fl.stop() // the harness, not the agent, writes cluster-2's CA now
	next, err := dataplane.NewRoot("pushed-too-early")
	require.NoError(t, err)
	cacerts, err := next.CACerts(ctx, "istiod-cluster-2", "cluster-2.local")
	require.NoError(t, err)
	current := rot.fed.meshes["cluster-2"]
	cacerts[istiod.RootCertFile] = slices.Concat(current.cacerts[trust.KeyRootCert], next.PEM())
	rot.load.Mark("broken: pushing")
	_, err = f.c2.RestartIstiod(ctx, cacerts)
	require.NoError(t, err)
	for _, w := range f.workloadsOf("cluster-2") {
		require.NoError(t, w.RenewCertificate(ctx))
	}
	rot.load.Mark("broken: connections renewing")
	time.Sleep(afterRenew)
	rot.load.Mark("broken: settled")
	time.Sleep(verifyFor)
	s := rot.load.Mark("restored: pushing")
	for _, flow := range []string{flow12, flow21} {
		o := s.Flows[flow]
		assert.Equal(t, o.Total(), o.Failed(), "broken: %s: every RPC fails: %s", flow, o)
	}
	// Back on the agent's cacerts: the failures end once every connection
	// handshook again with certificates of one root.
	start := time.Now()
	_, err = f.c2.RestartIstiod(ctx, current.cacerts)
	require.NoError(t, err)
	for _, w := range f.workloadsOf("cluster-2") {
		require.NoError(t, w.RenewCertificate(ctx))
	}
	rot.load.Mark("restored: connections renewing")
	deadline := time.Now().Add(settle)
	for {
		time.Sleep(verifyFor)
		s := rot.load.Mark("restored: connections renewing")
		if s.Total().Total() > 0 && s.Total().Failed() == 0 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("broken push undone: traffic clean again %s after cluster-2's istiod was put back on its agent's cacerts", time.Since(start).Round(time.Millisecond))
	rot.verify("restored")
}

// report logs the phase timings and every segment's counts.
func (rot *rotation) report(segs []*dataplane.Segment, took time.Duration) {
	t := rot.t
	var b bytes.Buffer
	fmt.Fprintf(&b, "phase timings (command: `relaymesh ca rotate … --wait` until the phase waits; adopt: both istiods restarted on the agents' cacerts and every workload re-issued; total: until the phase's traffic was verified):\n")
	for _, p := range rot.phases {
		fmt.Fprintf(&b, "  %-62s command %6s  adopt %6s  total %6s  (%s)\n", p.name, p.command.Round(time.Millisecond), p.adopt.Round(time.Millisecond), p.total.Round(time.Millisecond), p.step)
	}
	fmt.Fprintf(&b, "istiod restarts and re-issues by the follower:\n")
	for _, e := range rot.fl.events {
		fmt.Fprintf(&b, "  %s %s: restart %s, %d workloads re-issued in %s; %d roots, intermediate %s\n", e.at.Format("15:04:05.000"), e.cluster,
			e.restart.Round(time.Millisecond), len(rot.fed.f.workloadsOf(e.cluster)), e.renew.Round(time.Millisecond), e.roots, e.intermediateKey)
	}
	fmt.Fprintf(&b, "load segments:\n")
	for _, s := range segs {
		o := s.Total()
		fmt.Fprintf(&b, "  %-70s %7s  %5d RPCs  %4.0f/s %4.0f/s  failed %d\n", s.Name, s.Duration().Round(time.Millisecond), o.Total(), s.Rate(flow12), s.Rate(flow21), o.Failed())
		if o.Failed() > 0 {
			fmt.Fprintf(&b, "      %s\n", o)
		}
	}
	fmt.Fprintf(&b, "the rotation (start to Finished) took %s\n", took.Round(time.Millisecond))
	t.Log(b.String())
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
