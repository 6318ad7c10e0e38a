package identity

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/relaymesh/relaymesh/audit"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// annotationAudited marks a token record whose minting is in the audit log,
// so a server restart does not record it again.
const annotationAudited = "relaymesh.io/audited"

// AuditTokenMints records every bootstrap token minted in namespace (by
// `relaymesh cluster register` or `relaymesh token create`, which run
// outside the server) in the server's audit log, once, with the minter
// (MintedByAnnotation) as the record's subject. It returns when the
// watch has synced; it runs until ctx ends.
func AuditTokenMints(ctx context.Context, client kubernetes.Interface, namespace string, rec audit.Recorder, log *slog.Logger) error {
	factory := tokenRecordInformers(client, namespace)
	inf := factory.Core().V1().Secrets().Informer()
	factory.Start(ctx.Done())
	return AuditTokenMintsFrom(ctx, inf, client, namespace, rec, log)
}

// AuditTokenMintsFrom is AuditTokenMints on records, a running watch of
// namespace's token records (KubeTokenStore.Records): the records it
// holds already are looked at once it is called, and its handler is
// removed when ctx ends, so a replica that leads again adds it anew.
func AuditTokenMintsFrom(ctx context.Context, records cache.SharedIndexInformer, client kubernetes.Interface, namespace string, rec audit.Recorder, log *slog.Logger) error {
	handle := func(obj any) {
		sec, ok := obj.(*corev1.Secret)
		if !ok || sec.Type != TokenSecretType || sec.Annotations[annotationAudited] == "true" {
			return
		}
		id := sec.Name[len(tokenSecretPrefix):]
		details := map[string]string{"token_id": id, "expires_at": string(sec.Data[keyExpiresAt]), "minted_at": sec.CreationTimestamp.UTC().Format(time.RFC3339)}
		actor := sec.Annotations[MintedByAnnotation]
		if actor == "" {
			details["minted_by"] = "unknown: the minting client did not record its user"
		}
		err := rec.Record(audit.Event{
			Type: audit.TokenMint, Result: audit.ResultSuccess, Cluster: string(sec.Data[keyCluster]), Subject: actor, Details: details,
		})
		if err != nil {
			log.Error("audit log write failed", "type", audit.TokenMint, "error", err)
			return
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{annotationAudited: "true"}}})
		if _, err := client.CoreV1().Secrets(namespace).Patch(ctx, sec.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			log.Warn("could not mark token record audited; it may be recorded again after a restart", "token_id", id, "error", err)
		}
	}
	reg, err := records.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: handle, UpdateFunc: func(_, o any) { handle(o) }})
	if err != nil {
		return err
	}
	context.AfterFunc(ctx, func() { _ = records.RemoveEventHandler(reg) })
	if !cache.WaitForCacheSync(ctx.Done(), records.HasSynced, reg.HasSynced) {
		return fmt.Errorf("token watch did not sync: %w", ctx.Err())
	}
	return nil
}
