package trust_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/audit"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.step.sm/crypto/pemutil"
	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// replica is one server replica's trust controller: its own outputs, acks
// and leadership, and clients that count every request that is not a read.
type replica struct {
	name    string
	outputs *server.Outputs
	view    *server.View
	ctl     *trust.Controller
	lead    atomic.Bool

	mu     sync.Mutex
	writes []string // method and path of every request other than GET
}

func (r *replica) wrote() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.writes)
}

// setLeading flips the replica's Lease and tells its controller, as the
// server does from the elector's term start and end.
func (r *replica) setLeading(v bool) {
	r.lead.Store(v)
	r.ctl.Kick()
}

type countingTransport struct {
	next http.RoundTripper
	r    *replica
}

func (c countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet {
		c.r.mu.Lock()
		c.r.writes = append(c.r.writes, req.Method+" "+req.URL.Path)
		c.r.mu.Unlock()
	}
	return c.next.RoundTrip(req)
}

// startReplica starts a trust controller on the world's apiserver that
// leads while its lead flag is set.
func (w *rotationWorld) startReplica(name string, leading bool) *replica {
	w.t.Helper()
	r := &replica{name: name, outputs: server.NewOutputs(time.Now()), view: server.NewView()}
	r.lead.Store(leading)
	cfg := rest.CopyConfig(env.Cluster("cluster-1").RESTConfig())
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return countingTransport{next: rt, r: r} }
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(w.t, err)
	kube, err := kubernetes.NewForConfig(cfg)
	require.NoError(w.t, err)
	ctx, cancel := context.WithCancel(w.ctx)
	w.t.Cleanup(cancel)
	r.ctl, err = trust.Start(ctx, trust.Config{Dynamic: dyn, Kube: kube, Namespace: w.ns, Outputs: r.outputs, Acks: r.view,
		Clusters: func() []string { return w.clusters }, Audit: audit.Discard, Leading: r.lead.Load})
	require.NoError(w.t, err)
	return r
}

// trustOf is what r publishes for cluster, in mesh order.
func trustOf(r *replica, cluster string) []*relaypb.TrustRequest {
	reqs := slices.Clone(r.outputs.Get(cluster).GetTrust())
	slices.SortFunc(reqs, func(a, b *relaypb.TrustRequest) int { return cmp.Compare(a.GetMesh(), b.GetMesh()) })
	return reqs
}

func sameTrust(a, b []*relaypb.TrustRequest) bool {
	return slices.EqualFunc(a, b, func(x, y *relaypb.TrustRequest) bool { return proto.Equal(x, y) })
}

// identical reports whether every replica publishes, for every cluster, the
// trust requests the first one does (and some).
func (w *rotationWorld) identical(rs ...*replica) bool {
	for _, cl := range w.clusters {
		want := trustOf(rs[0], cl)
		if len(want) == 0 {
			return false
		}
		for _, r := range rs[1:] {
			if !sameTrust(want, trustOf(r, cl)) {
				return false
			}
		}
	}
	return true
}

// syncVia lets every agent apply the set from publishes for its cluster,
// its intermediates signed by signer, and acks it to every replica that
// publishes the same trust requests (each with its own version): agents
// spread over replicas, each replica learning every ack.
func (w *rotationWorld) syncVia(from, signer *replica, all ...*replica) {
	w.t.Helper()
	for _, cl := range w.clusters {
		set := from.outputs.Get(cl)
		if set == nil {
			continue
		}
		results, _ := w.agents[cl].Apply(w.ctx, set, func(ctx context.Context, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
			return signer.ctl.SignIntermediate(ctx, cl, req)
		})
		for _, res := range results {
			require.Empty(w.t, res.GetError(), "%s applies %s's set, signed by %s", cl, from.name, signer.name)
		}
		for _, r := range all {
			if rs := r.outputs.Get(cl); rs != nil && sameTrust(trustOf(r, cl), trustOf(from, cl)) {
				r.view.Acked(cl, &relaypb.PullAck{Version: rs.GetVersion(), Results: results}, time.Now())
			}
		}
	}
}

// published describes what r publishes to the world's first cluster: the
// issuer's fingerprint and the roots of the bundle.
func (w *rotationWorld) published(r *replica) (issuer string, roots []string) {
	reqs := trustOf(r, w.clusters[0])
	if len(reqs) == 0 {
		return "", nil
	}
	certs, err := pemutil.ParseCertificateBundle(reqs[0].GetRootBundle())
	if err != nil {
		return reqs[0].GetIssuer(), nil
	}
	for _, c := range certs {
		roots = append(roots, trust.Fingerprint(c))
	}
	slices.Sort(roots)
	return reqs[0].GetIssuer(), roots
}

// step is where a rotation is: -1 before it, 0–3 its steps, 4 Finished.
func step(rot *networkingv1alpha1.RotationStatus) int {
	switch {
	case rot == nil:
		return -1
	case rot.Phase == networkingv1alpha1.PhaseFinished:
		return 4
	}
	return int(rot.Step)
}

// expected is what a step asks of every mesh: the issuer and the roots.
func expected(s int, old, nu string) (string, []string) {
	switch s {
	case -1, 0:
		return old, []string{old}
	case 1:
		return old, sorted(old, nu)
	case 2:
		return nu, sorted(old, nu)
	}
	return nu, []string{nu}
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

// atStep waits until the status records step want, the leader publishes
// what that step asks, and every replica publishes exactly what the leader
// does. Every status seen on the way is passed to seen.
func (w *rotationWorld) atStep(want int, old string, nu *string, seen func(*networkingv1alpha1.RotationStatus), leader *replica, all ...*replica) *networkingv1alpha1.VirtualMesh {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		vm := w.vm()
		rot := vm.Status.Rotation
		seen(rot)
		if rot != nil && rot.NewRootFingerprint != "" {
			*nu = rot.NewRootFingerprint
		}
		issuer, roots := w.published(leader)
		wi, wr := expected(want, old, *nu)
		if step(rot) == want && issuer == wi && slices.Equal(roots, wr) && w.identical(append([]*replica{leader}, all...)...) {
			return vm
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("step %d not published alike by every replica within 30s; status.rotation %+v; leader publishes issuer %s roots %v",
				want, rot, trust.ShortFingerprint(issuer), roots)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// monotonic records the steps a rotation's status goes through and fails
// the test if it ever goes back.
func monotonic(t *testing.T) func(*networkingv1alpha1.RotationStatus) {
	last := -1
	return func(rot *networkingv1alpha1.RotationStatus) {
		t.Helper()
		s := step(rot)
		if s < last {
			t.Errorf("the rotation went back from step %d to %d: %+v", last, s, rot)
		}
		last = max(last, s)
	}
}

// Two replicas on one apiserver, one leading: the leader drives a whole
// root rotation; at every step both publish the same trust requests and
// either signs the intermediates agents ask for, and the follower writes
// nothing at all to the apiserver (no status, no generated root, no
// annotation).
func TestFollowerPublishesWhatTheLeaderRecords(t *testing.T) {
	w := setupRotationWorld(t, 2, "{generated: {}}", false)
	leader := w.startReplica("leader", true)
	follower := w.startReplica("follower", false)
	seen := monotonic(t)
	var nu string
	vm := w.waitForVM("root recorded", func(vm *networkingv1alpha1.VirtualMesh) bool {
		return vm.Status.SharedTrust != nil && vm.Status.SharedTrust.RootFingerprint != ""
	})
	old := vm.Status.SharedTrust.RootFingerprint
	w.atStep(-1, old, &nu, seen, leader, follower)
	w.syncVia(leader, follower, leader, follower)
	holds(t, w.meshCAs(), []string{old}, old)

	// A new generation: the leader makes the new root and starts the
	// rotation; every step is published alike, acked, and moves on.
	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "2")
	signers := []*replica{follower, leader}
	var prev map[string]*trust.MeshCA
	for i, s := range []int{1, 2, 3, 4} {
		w.atStep(s, old, &nu, seen, leader, follower)
		require.NotEmpty(t, nu)
		// The follower's set is the one applied; either replica signs.
		w.syncVia(follower, signers[i%2], leader, follower)
		cas := w.meshCAs()
		issuer, roots := expected(s, old, nu)
		holds(t, cas, roots, issuer)
		if prev != nil {
			trustEachOther(t, prev, cas)
		}
		prev = cas
		assert.Empty(t, follower.wrote(), "step %d: the follower wrote to the apiserver", s)
	}
	vm = w.vm()
	assert.Equal(t, networkingv1alpha1.PhaseFinished, vm.Status.Rotation.Phase)
	assert.Equal(t, nu, vm.Status.SharedTrust.RootFingerprint)
	assert.Len(t, vm.Status.SharedTrust.Meshes, 2, "the issued intermediates are recorded")
	assert.NotEmpty(t, leader.wrote(), "the leader wrote the status")

	// Still nothing from the follower a while later (its watches keep
	// running, its reconciles keep following).
	time.Sleep(500 * time.Millisecond)
	assert.Empty(t, follower.wrote(), "the follower wrote to the apiserver")
	rv := w.vm().ResourceVersion
	follower.ctl.Kick()
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, rv, w.vm().ResourceVersion, "a follower's reconcile changes nothing")
}

// The Lease moves in the middle of a rotation, with a moment in which both
// replicas think they lead (the deposed one has not noticed yet): the new
// leader goes on from the step the status records, the rotation finishes,
// its status never goes back, and the deposed leader writes nothing once it
// follows.
func TestLeadershipMovesMidRotation(t *testing.T) {
	w := setupRotationWorld(t, 2, "{generated: {}}", false)
	a := w.startReplica("a", true)
	b := w.startReplica("b", false)
	seen := monotonic(t)
	var nu string
	vm := w.waitForVM("root recorded", func(vm *networkingv1alpha1.VirtualMesh) bool {
		return vm.Status.SharedTrust != nil && vm.Status.SharedTrust.RootFingerprint != ""
	})
	old := vm.Status.SharedTrust.RootFingerprint
	w.atStep(-1, old, &nu, seen, a, b)
	w.syncVia(a, a, a, b)
	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "2")
	w.atStep(1, old, &nu, seen, a, b)
	w.syncVia(a, a, a, b)
	w.atStep(2, old, &nu, seen, a, b)
	require.Empty(t, b.wrote(), "b wrote while following")

	// b starts leading before a notices it lost the Lease; the agents ack
	// step 2 to both meanwhile.
	b.setLeading(true)
	w.syncVia(b, b, a, b)
	for range 10 {
		vm := w.vm()
		seen(vm.Status.Rotation)
		time.Sleep(50 * time.Millisecond)
	}
	a.setLeading(false)
	// Let a's last reconcile as leader end before counting.
	time.Sleep(500 * time.Millisecond)
	aWrites := len(a.wrote())

	// b finishes the rotation from the step the status records.
	s := step(w.vm().Status.Rotation)
	require.GreaterOrEqual(t, s, 2)
	for ; s <= 4; s++ {
		w.atStep(s, old, &nu, seen, b, a)
		if s < 4 {
			w.syncVia(b, a, a, b)
		}
	}
	vm = w.vm()
	assert.Equal(t, networkingv1alpha1.PhaseFinished, vm.Status.Rotation.Phase)
	assert.Equal(t, nu, vm.Status.SharedTrust.RootFingerprint)
	holds(t, w.meshCAs(), []string{nu}, nu)
	assert.Equal(t, aWrites, len(a.wrote()), "a wrote after it stopped leading: %v", a.wrote()[aWrites:])
	bWrites := len(b.wrote())
	assert.NotZero(t, bWrites, "b drove the rotation")

	// Back to a: nothing left to move, and a writes the status b recorded
	// only if it needs to (it reads it afresh first).
	b.setLeading(false)
	a.setLeading(true)
	time.Sleep(500 * time.Millisecond)
	vm = w.vm()
	seen(vm.Status.Rotation)
	assert.Equal(t, networkingv1alpha1.PhaseFinished, vm.Status.Rotation.Phase)
	assert.Equal(t, nu, vm.Status.SharedTrust.RootFingerprint)
	assert.Equal(t, bWrites, len(b.wrote()), "b wrote after it stopped leading")
	require.Eventually(t, func() bool { return w.identical(a, b) }, 10*time.Second, 20*time.Millisecond)
}

// Two replicas that both think they lead (a Lease expiring under a slow
// replica) race on every step of a Manual rotation, both seeing every ack:
// the rotation still goes through every step once, in order, and its status
// never goes back (TestStaleWriteIsRefused shows the refusal that makes it
// so deterministically).
func TestTwoLeadersRaceOnARotation(t *testing.T) {
	w := setupRotationWorld(t, 2, "{generated: {}}", true)
	a := w.startReplica("a", true)
	b := w.startReplica("b", true) // two leaders: what a Lease expiring under a slow replica can make
	seen := monotonic(t)
	var nu string
	vm := w.waitForVM("root recorded", func(vm *networkingv1alpha1.VirtualMesh) bool {
		return vm.Status.SharedTrust != nil && vm.Status.SharedTrust.RootFingerprint != ""
	})
	old := vm.Status.SharedTrust.RootFingerprint
	w.atStep(-1, old, &nu, seen, a, b)
	w.syncVia(a, a, a, b)
	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "2")
	for _, s := range []int{1, 2, 3} {
		w.atStep(s, old, &nu, seen, a, b)
		w.syncVia(a, b, a, b)
		w.waitForVM(fmt.Sprintf("step %d awaiting continue", s), func(vm *networkingv1alpha1.VirtualMesh) bool {
			seen(vm.Status.Rotation)
			return step(vm.Status.Rotation) == s && vm.Status.Rotation.AwaitingContinue
		})
		w.annotate(networkingv1alpha1.AnnotationRotationContinue, string(w.vm().Status.Rotation.Phase)+"/"+nu)
	}
	w.atStep(4, old, &nu, seen, a, b)
	for range 10 {
		seen(w.vm().Status.Rotation)
		time.Sleep(50 * time.Millisecond)
	}
	assert.Equal(t, networkingv1alpha1.PhaseFinished, w.vm().Status.Rotation.Phase)
}

// waitForVM waits until the VirtualMesh satisfies cond.
func (w *rotationWorld) waitForVM(what string, cond func(*networkingv1alpha1.VirtualMesh) bool) *networkingv1alpha1.VirtualMesh {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		vm := w.vm()
		if cond(vm) {
			return vm
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: not within 30s; status %+v", what, vm.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A leader's status write is conditional on the resourceVersion its state
// was read at: when another leader moved the rotation on since (faked here
// by that leader's write of step 2, with the same field manager), the stale
// leader's next write — the pending meshes of step 1, after an agent
// reports an error — is refused instead of moving the status back; the
// stale leader reads the status afresh and goes on from step 2.
func TestStaleWriteIsRefused(t *testing.T) {
	w := setupRotationWorld(t, 2, "{generated: {}}", true)
	a := w.startReplica("a", true)
	seen := monotonic(t)
	var nu string
	vm := w.waitForVM("root recorded", func(vm *networkingv1alpha1.VirtualMesh) bool {
		return vm.Status.SharedTrust != nil && vm.Status.SharedTrust.RootFingerprint != ""
	})
	old := vm.Status.SharedTrust.RootFingerprint
	w.atStep(-1, old, &nu, seen, a)
	w.syncVia(a, a, a)
	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "2")
	w.atStep(1, old, &nu, seen, a)
	w.syncVia(a, a, a)
	w.waitForVM("step 1 awaiting continue", func(vm *networkingv1alpha1.VirtualMesh) bool {
		return step(vm.Status.Rotation) == 1 && vm.Status.Rotation.AwaitingContinue
	})

	// Another leader's write: step 2.
	u, err := w.dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace(w.ns).Get(w.ctx, "shared", metav1.GetOptions{})
	require.NoError(t, err)
	st := u.Object["status"].(map[string]any)
	rot := st["rotation"].(map[string]any)
	rot["phase"], rot["step"], rot["awaitingContinue"] = string(networkingv1alpha1.PhasePropagatingNewIntermediate), int64(2), false
	body, err := json.Marshal(map[string]any{"apiVersion": networkingv1alpha1.GroupVersion.String(), "kind": "VirtualMesh",
		"metadata": map[string]any{"name": "shared", "namespace": w.ns}, "status": map[string]any{"sharedTrust": st["sharedTrust"], "rotation": rot}})
	require.NoError(t, err)
	_, err = w.dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace(w.ns).
		Patch(w.ctx, "shared", types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "relaymesh-trust", Force: new(true)}, "status")
	require.NoError(t, err)

	// c1's agent reports an error for its cacerts: a's state (step 1)
	// would now list it as pending.
	a.view.Acked("c1", &relaypb.PullAck{Version: a.outputs.Get("c1").GetVersion(), Results: []*relaypb.ObjectResult{{
		ApiVersion: "v1", Kind: "Secret", Namespace: w.meshNS["c1"], Name: trust.SecretName, Outcome: "error", Error: "test"}}}, time.Now())
	a.ctl.Kick()
	for range 20 {
		seen(w.vm().Status.Rotation)
		time.Sleep(50 * time.Millisecond)
	}
	w.atStep(2, old, &nu, seen, a)
	assert.Equal(t, int32(2), w.vm().Status.Rotation.Step)
}
