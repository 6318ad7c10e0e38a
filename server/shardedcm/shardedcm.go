// Package shardedcm keeps a map of per-cluster records that the server's
// replicas share through the management cluster's apiserver: a few
// ConfigMaps (shards) of the server namespace, each record under its
// cluster's name in the shard the name hashes to. Every replica reads the
// map from a watch; writes touch only the shards of the records they
// change, each in one JSON patch that tests every record it replaces
// (replicas writing different records of one shard do not conflict; a
// record another replica changed meanwhile fails the patch, which is read
// again and retried), shards in parallel. The output heads (server/heads)
// and the ack ledger (server/acks) are two such maps.
package shardedcm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/internal/text"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Shards is the number of ConfigMaps a map is spread over.
const Shards = 16

// Kind names one map: its ConfigMaps are Prefix + "NN", labelled Label=true.
type Kind struct {
	Prefix, Label string
	// What a record is, for logs ("output head").
	What string
}

// ShardName is the ConfigMap holding cluster's record.
func (k Kind) ShardName(cluster string) string {
	h := fnv.New32a()
	h.Write([]byte(cluster))
	return fmt.Sprintf("%s%02d", k.Prefix, h.Sum32()%Shards)
}

// Codec reads and writes records of type V; the zero V is "no record".
type Codec[V comparable] struct {
	Parse  func(string) (V, error)
	Encode func(V) string
	// Replaces reports whether v is to be written over the stored record
	// (ok: one is stored and parses). Records that only move forward say
	// no to an older v, so a writer that is late never undoes a newer one.
	Replaces func(v, stored V, ok bool) bool
}

// Map is one shared map, as this replica sees and writes it.
type Map[V comparable] struct {
	kind      Kind
	codec     Codec[V]
	client    kubernetes.Interface
	namespace string
	log       *slog.Logger
	informer  cache.SharedIndexInformer

	mu        sync.RWMutex
	shards    map[string]map[string]V // shard → cluster → record, as last applied
	all       map[string]V
	listeners []func(cluster string)
	// written holds, per shard, what this replica's last write of it
	// returned, until the watch shows that copy or a later one: the writer
	// reads its own write at once (the leader serves a head it wrote
	// without waiting for its watch), and the watch's older copies in
	// between do not take it back (for ownWriteLead at most).
	written map[string]writtenCopy
	// applied is the resourceVersion of each shard's copy last applied.
	applied map[string]string
}

type writtenCopy struct {
	cm *corev1.ConfigMap
	at time.Time
}

// ownWriteLead bounds how long a replica's own write of a shard is
// preferred to the watch's older copies: a watch that never catches up
// (resourceVersions gone back after an etcd restore) is believed again
// after it.
const ownWriteLead = 10 * time.Second

// New returns kind's map in namespace; call Start.
func New[V comparable](client kubernetes.Interface, namespace string, kind Kind, codec Codec[V], log *slog.Logger) *Map[V] {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 10*time.Minute, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = kind.Label + "=true" }))
	return &Map[V]{kind: kind, codec: codec, client: client, namespace: namespace, log: log,
		informer: f.Core().V1().ConfigMaps().Informer(), shards: map[string]map[string]V{}, all: map[string]V{},
		written: map[string]writtenCopy{}, applied: map[string]string{}}
}

// OnChange registers f, called with each cluster whose record changed, on
// the watch's goroutine or, for this replica's own writes, on the writing
// goroutine (several at once): f must be safe for concurrent calls.
// Register before Start.
func (m *Map[V]) OnChange(f func(cluster string)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.listeners = append(m.listeners, f)
}

// Start watches the map and returns once the first list is in.
func (m *Map[V]) Start(ctx context.Context) error {
	h := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			m.reload(cm.Name)
		}
	}
	if _, err := m.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: h, UpdateFunc: func(_, o any) { h(o) }, DeleteFunc: h}); err != nil {
		return err
	}
	go m.informer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), m.informer.HasSynced) {
		return fmt.Errorf("%ss: watch of ConfigMaps labelled %s=true did not sync: %w", m.kind.What, m.kind.Label, ctx.Err())
	}
	return nil
}

// reload reads one shard again from the cache (only the shard that
// changed: a write of one shard costs its records, not the whole map's)
// and applies it.
func (m *Map[V]) reload(shard string) {
	if !strings.HasPrefix(shard, m.kind.Prefix) {
		return
	}
	var cm *corev1.ConfigMap
	if o, ok, _ := m.informer.GetStore().GetByKey(m.namespace + "/" + shard); ok {
		cm, _ = o.(*corev1.ConfigMap)
	}
	m.apply(shard, cm, false)
}

// before reports whether resourceVersion a is below b, as the apiserver's
// comparable resourceVersions order (resourceversion.CompareResourceVersion,
// the same rule the trust controller compares by); a version that is not
// well formed is never before another, so a watch copy with one is taken
// as it comes and an own write with one is left to the watch.
func before(a, b string) bool {
	c, err := resourceversion.CompareResourceVersion(a, b)
	return err == nil && c < 0
}

// apply makes cm (nil: the shard does not exist) the shard's content and
// tells listeners which records changed. A copy this replica wrote
// (ownWrite) is applied only if it is past the copy last applied, whatever
// its source; from the watch, a copy older than this replica's last write
// of the shard is skipped (the write was applied already and the watch has
// not caught up). A record that does not parse, or sits in another
// cluster's shard, is skipped and logged: only replicas write these maps,
// and no record is the safe reading of one.
func (m *Map[V]) apply(shard string, cm *corev1.ConfigMap, ownWrite bool) {
	next := map[string]V{}
	if cm != nil {
		malformed := 0
		for cluster, v := range cm.Data {
			r, err := m.codec.Parse(v)
			if err != nil || m.kind.ShardName(cluster) != shard {
				if malformed == 0 {
					m.log.Warn("ignoring a malformed "+m.kind.What, "configmap", shard, "cluster", text.Truncate(cluster, 80))
				}
				malformed++
				continue
			}
			next[cluster] = r
		}
	}
	m.mu.Lock()
	if ownWrite {
		applied, seen := m.applied[shard]
		_, malformed := resourceversion.CompareResourceVersion(cm.ResourceVersion, cm.ResourceVersion)
		if malformed != nil || (seen && !before(applied, cm.ResourceVersion)) {
			m.mu.Unlock()
			return // a later copy is applied already (or versions do not compare)
		}
		m.written[shard] = writtenCopy{cm: cm, at: time.Now()}
	} else {
		if w, ok := m.written[shard]; ok && cm != nil && before(cm.ResourceVersion, w.cm.ResourceVersion) && time.Since(w.at) < ownWriteLead {
			m.mu.Unlock()
			return
		}
		delete(m.written, shard)
	}
	if cm != nil {
		m.applied[shard] = cm.ResourceVersion
	} else {
		delete(m.applied, shard)
	}
	prev := m.shards[shard]
	var changed []string
	for c, r := range next {
		if old, ok := prev[c]; !ok || old != r {
			changed = append(changed, c)
		}
		m.all[c] = r
	}
	for c := range prev {
		if _, ok := next[c]; !ok {
			changed = append(changed, c)
			delete(m.all, c)
		}
	}
	m.shards[shard] = next
	listeners := m.listeners
	m.mu.Unlock()
	slices.Sort(changed)
	for _, c := range changed {
		for _, f := range listeners {
			f(c)
		}
	}
}

// Get returns cluster's record as the watch last showed it.
func (m *Map[V]) Get(cluster string) (V, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	r, ok := m.all[cluster]
	return r, ok
}

// All returns a copy of every record.
func (m *Map[V]) All() map[string]V {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return maps.Clone(m.all)
}

// Clusters returns the clusters that have a record, sorted.
func (m *Map[V]) Clusters() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Sorted(maps.Keys(m.all))
}

// Write stores records (a zero V deletes the cluster's), each touched
// shard in one patch, shards in parallel. A record the codec says does
// not replace the stored one is not written. It returns what it could not
// write.
func (m *Map[V]) Write(ctx context.Context, records map[string]V) error {
	byShard := map[string]map[string]V{}
	for c, r := range records {
		n := m.kind.ShardName(c)
		if byShard[n] == nil {
			byShard[n] = map[string]V{}
		}
		byShard[n][c] = r
	}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for name, rs := range byShard {
		wg.Go(func() {
			if err := m.writeShard(ctx, name, rs); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (m *Map[V]) writeShard(ctx context.Context, name string, rs map[string]V) error {
	cms := m.client.CoreV1().ConfigMaps(m.namespace)
	// The newest copy known first, the watch's or this replica's last
	// write's: usually current, it saves a read per write; where a record
	// written changed since, its test fails and the shard is read again.
	var cm *corev1.ConfigMap
	if o, ok, _ := m.informer.GetStore().GetByKey(m.namespace + "/" + name); ok {
		cm, _ = o.(*corev1.ConfigMap)
	}
	m.mu.RLock()
	if w, ok := m.written[name]; ok && (cm == nil || before(cm.ResourceVersion, w.cm.ResourceVersion)) {
		cm = w.cm
	}
	m.mu.RUnlock()
	cm = cm.DeepCopy()
	for attempt := 0; ; attempt++ {
		create := false
		if cm == nil {
			got, err := cms.Get(ctx, name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				create = true
				got = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: m.namespace,
					Labels: map[string]string{m.kind.Label: "true", "app.kubernetes.io/managed-by": "relaymesh"}}}
			case err != nil:
				return err
			}
			cm = got
		}
		ops := m.patchOps(cm, rs)
		if len(ops) == 0 || create && !slices.ContainsFunc(ops, func(op patchOp) bool { return op.Op == "add" }) {
			return nil // nothing to write, or only deletions from a shard that does not exist
		}
		var err error
		var stored *corev1.ConfigMap
		if create {
			cm.Data = map[string]string{}
			for _, op := range ops {
				if c, ok := strings.CutPrefix(op.Path, "/data/"); ok && op.Op == "add" {
					cm.Data[jsonPointerUnescape(c)] = op.Value.(string)
				}
			}
			stored, err = cms.Create(ctx, cm, metav1.CreateOptions{FieldManager: "relaymesh-server"})
		} else {
			var body []byte
			if body, err = json.Marshal(ops); err != nil {
				return err
			}
			stored, err = cms.Patch(ctx, name, types.JSONPatchType, body, metav1.PatchOptions{FieldManager: "relaymesh-server"})
		}
		if err == nil {
			m.apply(name, stored, true)
			return nil
		}
		if (!failedTest(err) && !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err)) || attempt >= 5 {
			return err
		}
		cm = nil // read it again
	}
}

// failedTest reports whether err is the apiserver refusing a JSON patch it
// could not apply (a test failed: another replica changed one of the
// records; 422 without causes), as opposed to the patched object failing
// validation (422 with the fields at fault, which reading again does not
// mend).
func failedTest(err error) bool {
	var st apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &st) {
		return false
	}
	d := st.Status().Details
	return d == nil || len(d.Causes) == 0
}

// patchOp is one JSON patch (RFC 6902) operation. A test of null passes
// where the member is absent: the apiserver's JSON patch library does so,
// and TestAStaleCopyIsReadAgain checks it on a real apiserver.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// patchOps are the operations that write rs over the shard copy cm: for
// each record to change, a test that it is still what cm holds (null:
// absent) and its add, replace or remove; a deletion of a record cm does
// not hold is a test that it is absent. Records the codec says must not
// replace the stored one are left out. A shard without data gets its data
// map first, tested absent too.
func (m *Map[V]) patchOps(cm *corev1.ConfigMap, rs map[string]V) []patchOp {
	var zero V
	var ops []patchOp
	for _, c := range slices.Sorted(maps.Keys(rs)) {
		r := rs[c]
		cur, present := cm.Data[c]
		path := "/data/" + jsonPointerEscape(c)
		var test any // null: absent
		if present {
			test = cur
		}
		if r == zero {
			if present {
				ops = append(ops, patchOp{Op: "test", Path: path, Value: test}, patchOp{Op: "remove", Path: path})
			} else {
				// Absent from the copy, maybe not from the shard: a
				// record another replica wrote after the copy fails the
				// test, and the shard is read again to remove it.
				ops = append(ops, patchOp{Op: "test", Path: path, Value: nil})
			}
			continue
		}
		stored, err := m.codec.Parse(cur)
		if !m.codec.Replaces(r, stored, present && err == nil) {
			continue
		}
		enc := m.codec.Encode(r)
		op := "add"
		if present {
			op = "replace"
		}
		ops = append(ops, patchOp{Op: "test", Path: path, Value: test}, patchOp{Op: op, Path: path, Value: enc})
	}
	if len(ops) > 0 && cm.Data == nil {
		ops = append([]patchOp{{Op: "test", Path: "/data"}, {Op: "add", Path: "/data", Value: map[string]string{}}}, ops...)
	}
	return ops
}

// jsonPointerEscape escapes a JSON pointer segment (RFC 6901).
func jsonPointerEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func jsonPointerUnescape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~1", "/"), "~0", "~")
}

// Read returns every record of kind stored in namespace, as a reader
// outside the server (a test, an operator's tool) sees them; malformed
// ones are left out.
func Read[V comparable](ctx context.Context, client kubernetes.Interface, namespace string, kind Kind, parse func(string) (V, error)) (map[string]V, error) {
	list, err := client.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{LabelSelector: kind.Label + "=true"})
	if err != nil {
		return nil, err
	}
	out := map[string]V{}
	for _, cm := range list.Items {
		if !strings.HasPrefix(cm.Name, kind.Prefix) {
			continue
		}
		for c, v := range cm.Data {
			if r, err := parse(v); err == nil && kind.ShardName(c) == cm.Name {
				out[c] = r
			}
		}
	}
	return out, nil
}
