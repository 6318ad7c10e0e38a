package controller

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
)

// Bounds on the lists of a user object's status, so that a status stays
// within the CRD's limits (and well under the apiserver's object size) at
// any fleet size; counts cover what the lists leave out.
const (
	maxListedClusters = 100
	maxListedTargets  = 256
	// maxNamedClusters bounds the clusters named in a Failed object's
	// error.
	maxNamedClusters = 10
	// statusWorkers write statuses in parallel.
	statusWorkers = 4
)

// Bounds on what an agent's ack may put into a user object's status.
const (
	maxApplyErrors   = 10
	maxApplyErrorLen = 256
)

// writtenStatus is a status known to be on an object at resourceVersion.
type writtenStatus struct{ body, resourceVersion string }

// statusWriter writes user objects' statuses from a keyed work queue: each
// translation sets the latest wanted status of every object (a burst of
// translations, say one per agent ack, coalesces into one write per object),
// workers write them in parallel without holding up translation, and a
// failed write is retried with backoff rather than waiting for the next
// change.
type statusWriter struct {
	c     *Controller
	queue workqueue.TypedRateLimitingInterface[translation.ObjectKey]

	mu      sync.Mutex
	wanted  map[translation.ObjectKey]wantedStatus
	written map[translation.ObjectKey]writtenStatus
}

// wantedStatus is the status translation last computed for an object.
type wantedStatus struct {
	gvr    schema.GroupVersionResource
	status map[string]any
	body   string
}

func newStatusWriter(c *Controller) *statusWriter {
	return &statusWriter{c: c,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[translation.ObjectKey](200*time.Millisecond, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[translation.ObjectKey]{Name: "translation-status"}),
		wanted: map[translation.ObjectKey]wantedStatus{}, written: map[translation.ObjectKey]writtenStatus{}}
}

// run writes queued statuses until ctx ends.
func (w *statusWriter) run(ctx context.Context) {
	for range statusWorkers {
		go func() {
			for w.processNext(ctx) {
			}
		}()
	}
	<-ctx.Done()
	w.queue.ShutDown()
}

// writeStatus sets the wanted status of every user object in r and queues
// the ones that differ from what is known to be written. Only the leader
// does; at the start of its term it forgets what it knew written, since
// another leader may have written since.
func (c *Controller) writeStatus(_ context.Context, r *translation.Report) {
	w := c.status
	if !c.leading() {
		c.led = false
		return
	}
	if !c.led {
		w.mu.Lock()
		clear(w.written)
		w.mu.Unlock()
		c.led = true
	}
	keys := r.Keys()
	inReport := make(map[translation.ObjectKey]bool, len(keys))
	for _, k := range keys {
		gvr, ok := userKinds[k.Kind]
		if !ok {
			continue
		}
		inReport[k] = true
		status := c.statusOf(k, r)
		body, err := json.Marshal(map[string]any{"status": status})
		if err != nil {
			continue
		}
		_, rv, found := c.current(gvr, k)
		w.mu.Lock()
		done := false
		if wr, ok := w.written[k]; ok && found && wr.body == string(body) && wr.resourceVersion == rv {
			done = true // nothing changed since it was last written or checked
		}
		if !done {
			w.wanted[k] = wantedStatus{gvr: gvr, status: status, body: string(body)}
		}
		w.mu.Unlock()
		if !done {
			w.queue.Add(k)
		}
	}
	w.mu.Lock()
	for k := range w.written {
		if !inReport[k] {
			delete(w.written, k)
		}
	}
	for k := range w.wanted {
		if !inReport[k] {
			delete(w.wanted, k)
		}
	}
	w.mu.Unlock()
}

func (w *statusWriter) processNext(ctx context.Context) bool {
	k, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(k)
	w.mu.Lock()
	want, ok := w.wanted[k]
	w.mu.Unlock()
	if !ok || !w.c.leading() {
		// A replica that stopped leading drops its queue; the next leader
		// computes every status again at the start of its term.
		w.queue.Forget(k)
		return true
	}
	if err := w.write(ctx, k, want); err != nil {
		if ctx.Err() != nil {
			return false
		}
		level := slog.LevelWarn
		if apierrors.IsConflict(err) {
			level = slog.LevelDebug // the object changed since this status was decided: decide again
		}
		w.c.log.Log(ctx, level, "could not write status; will retry", "kind", k.Kind, "namespace", k.Namespace, "name", k.Name,
			"retries", w.queue.NumRequeues(k), "error", err)
		w.queue.AddRateLimited(k)
		return true
	}
	w.queue.Forget(k)
	return true
}

// write patches one object's status unless its cached status already says
// the same.
func (w *statusWriter) write(ctx context.Context, k translation.ObjectKey, want wantedStatus) error {
	cur, rv, found := w.c.current(want.gvr, k)
	if !found {
		return nil // deleted (or not yet in the cache: the next translation queues it again)
	}
	record := func(rv string) {
		w.mu.Lock()
		// Only if no newer status was wanted meanwhile.
		if latest, ok := w.wanted[k]; ok && latest.body == want.body {
			w.written[k] = writtenStatus{body: want.body, resourceVersion: rv}
			delete(w.wanted, k)
		}
		w.mu.Unlock()
	}
	if reflect.DeepEqual(normalize(owned(cur, want.status)), normalize(want.status)) {
		record(rv)
		return nil
	}
	// The status was decided on the object at rv: the patch carries rv as
	// a precondition, so a replica whose view is behind (a deposed leader,
	// a cache that has not seen the new leader's write) gets a Conflict
	// instead of overwriting a newer status.
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": rv}, "status": want.status})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	patched, err := w.c.client.Resource(want.gvr).Namespace(k.Namespace).Patch(wctx, k.Name, types.MergePatchType, body, metav1.PatchOptions{}, "status")
	if err != nil {
		return err
	}
	record(patched.GetResourceVersion())
	return nil
}

// statusOf is the status translation wants on user object k: the report's
// verdict, targets and workloads, and where its outputs are applied, every
// list bounded (maxListed*) with counts of the whole.
func (c *Controller) statusOf(k translation.ObjectKey, r *translation.Report) map[string]any {
	st, targets, _ := r.Status(k)
	status := map[string]any{"observedGeneration": st.ObservedGeneration, "state": string(st.State)}
	status["errors"], status["warnings"] = nil, nil
	if len(st.Errors) > 0 {
		status["errors"] = st.Errors
	}
	if len(st.Warnings) > 0 {
		status["warnings"] = st.Warnings
	}
	field := "destinations"
	if k.Kind == "VirtualMesh" {
		field = "meshes"
	}
	status[field] = nil
	if len(targets) > 0 {
		status[field] = targetsJSON(boundTargets(targets))
	}
	if k.Kind != "VirtualMesh" {
		status["destinationCount"] = nil
		if len(targets) > 0 {
			status["destinationCount"] = len(targets)
		}
	}
	if k.Kind == "TrafficPolicy" || k.Kind == "AccessPolicy" {
		status["workloads"], status["workloadCount"] = nil, nil
		if ws := r.SourceWorkloads(k); len(ws) > 0 { // at most translation.MaxWorkloads, and how many more
			status["workloads"] = ws
			status["workloadCount"] = r.WorkloadCount(k)
		}
	}
	status["clusters"], status["clusterCounts"] = nil, nil
	if applied := c.applyStatus(translation.Parent(k)); len(applied) > 0 {
		listed, counts, failed := boundClusters(applied)
		status["clusters"] = targetsJSON(listed)
		status["clusterCounts"] = targetsJSON([]common.ClusterCounts{counts})[0]
		if len(failed) > 0 && st.State == common.StateAccepted {
			status["state"] = string(common.StateFailed)
			status["errors"] = append(st.Errors, fmt.Sprintf("outputs not applied in %s (see status.clusters)", nameClusters(failed, int(counts.Failed))))
		}
	}
	return status
}

// boundTargets keeps at most maxListedTargets targets, those not Accepted
// first (they carry the errors), each group in report order.
func boundTargets(ts []common.TargetStatus) []common.TargetStatus {
	if len(ts) <= maxListedTargets {
		return ts
	}
	out := make([]common.TargetStatus, 0, maxListedTargets)
	for _, accepted := range []bool{false, true} {
		for _, t := range ts {
			if (t.State == common.StateAccepted) == accepted && len(out) < maxListedTargets {
				out = append(out, t)
			}
		}
	}
	return out
}

// boundClusters counts the clusters by state and lists at most
// maxListedClusters: failed, then pending, then applied, each by name. It
// also returns the names of the failed ones it lists.
func boundClusters(all []common.ClusterApplyStatus) ([]common.ClusterApplyStatus, common.ClusterCounts, []string) {
	counts := common.ClusterCounts{Total: int32(min(len(all), math.MaxInt32))}
	rank := map[common.ApplyState]int{common.ApplyFailed: 0, common.ApplyPending: 1, common.ApplyApplied: 2}
	for _, a := range all {
		switch a.State {
		case common.ApplyFailed:
			counts.Failed++
		case common.ApplyPending:
			counts.Pending++
		default:
			counts.Applied++
		}
	}
	listed := all
	if len(all) > maxListedClusters {
		listed = slices.Clone(all)
		slices.SortStableFunc(listed, func(a, b common.ClusterApplyStatus) int {
			return cmp.Or(cmp.Compare(rank[a.State], rank[b.State]), strings.Compare(a.Cluster, b.Cluster))
		})
		listed = listed[:maxListedClusters]
		// The CRD lists clusters by name (a map list); keep that order.
		slices.SortFunc(listed, func(a, b common.ClusterApplyStatus) int { return strings.Compare(a.Cluster, b.Cluster) })
	}
	var failed []string
	for _, a := range listed {
		if a.State == common.ApplyFailed {
			failed = append(failed, a.Cluster)
		}
	}
	return listed, counts, failed
}

// nameClusters names at most maxNamedClusters of the failed clusters, and
// how many more there are of total.
func nameClusters(failed []string, total int) string {
	named := failed[:min(len(failed), maxNamedClusters)]
	s := "cluster " + strings.Join(named, ", ")
	if len(named) > 1 {
		s = "clusters " + strings.Join(named, ", ")
	}
	if more := total - len(named); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}

// current returns the status and resourceVersion of a user object in the
// informer's cache.
func (c *Controller) current(gvr schema.GroupVersionResource, k translation.ObjectKey) (map[string]any, string, bool) {
	obj, exists, err := c.informers[gvr].GetStore().GetByKey(k.Namespace + "/" + k.Name)
	if err != nil || !exists {
		return nil, "", false
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, "", false
	}
	st, _, _ := unstructured.NestedMap(u.Object, "status")
	return st, u.GetResourceVersion(), true
}

// applyStatus is where p's outputs are and whether each cluster's agent
// applied them: Pending until the agent acks the version that carries them,
// then Applied, or Failed naming each object it did not apply.
func (c *Controller) applyStatus(p translation.Parent) []common.ClusterApplyStatus {
	if c.acks == nil {
		return nil
	}
	var out []common.ClusterApplyStatus
	for _, cl := range slices.Sorted(maps.Keys(c.parentsIn)) {
		keys := c.parentsIn[cl][p]
		if len(keys) == 0 {
			continue
		}
		st := common.ClusterApplyStatus{Cluster: cl, State: common.ApplyPending}
		ack := c.acks.Ack(cl)
		if ack != nil {
			st.Version = int64(min(ack.GetVersion(), math.MaxInt64))
		}
		if ack != nil && ack.GetVersion() >= c.versions[cl] {
			st.State = common.ApplyApplied
			for _, r := range ack.GetResults() {
				if o := r.GetOutcome(); o != "conflict" && o != "error" {
					continue
				}
				key := strings.Join([]string{r.GetApiVersion(), r.GetKind(), r.GetNamespace(), r.GetName()}, "/")
				if _, mine := slices.BinarySearch(keys, key); !mine {
					continue
				}
				st.State = common.ApplyFailed
				if len(st.Errors) < maxApplyErrors {
					msg := fmt.Sprintf("%s %s/%s: %s", r.GetKind(), r.GetNamespace(), r.GetName(), r.GetOutcome())
					if e := r.GetError(); e != "" {
						msg += ": " + e
					}
					if len(msg) > maxApplyErrorLen {
						msg = msg[:maxApplyErrorLen] + "…"
					}
					st.Errors = append(st.Errors, strings.ToValidUTF8(msg, ""))
				}
			}
		}
		out = append(out, st)
	}
	return out
}

func targetsJSON[T any](ts []T) []any {
	b, _ := json.Marshal(ts)
	var out []any
	_ = json.Unmarshal(b, &out)
	return out
}

// owned keeps the fields of cur that translation writes (status has every
// one of them, nil when unset): other writers own the rest (the trust
// controller's sharedTrust), which must not make statuses differ forever.
func owned(cur, status map[string]any) map[string]any {
	out := map[string]any{}
	for k := range status {
		if v, ok := cur[k]; ok {
			out[k] = v
		}
	}
	return out
}

// normalize drops nil values and round-trips through JSON so a cached
// status compares equal to the one about to be written.
func normalize(m map[string]any) map[string]any {
	clean := map[string]any{}
	for k, v := range m {
		if v != nil {
			clean[k] = v
		}
	}
	b, _ := json.Marshal(clean)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	delete(out, "conditions")
	return out
}
