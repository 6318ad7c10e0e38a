package identity

import (
	"context"
	"encoding/json"
	"errors"
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

// markTimeout bounds the patch that marks a recorded mint.
const markTimeout = 10 * time.Second

// AuditTokenMints records every bootstrap token minted in namespace (by
// `relaymesh cluster register` or `relaymesh token create`, which run
// outside the server) in the server's audit log, once, with the minter
// (MintedByAnnotation) as the record's subject. records is a running watch
// of namespace's token records (KubeTokenStore.Records), so the process
// caches each record once. It returns when the records the watch holds
// have been looked at (each unaudited one recorded and marked); its
// handler records nothing once ctx has ended and is removed then, so a
// replica that leads again adds it anew.
func AuditTokenMints(ctx context.Context, records cache.SharedIndexInformer, client kubernetes.Interface, namespace string, rec audit.Recorder, log *slog.Logger) error {
	if records == nil {
		return errors.New("token mint audit: no watch of the token records")
	}
	handle := func(obj any) {
		sec, ok := obj.(*corev1.Secret)
		// A term that ended records nothing more: the handler may still be
		// called until its removal takes effect.
		if ctx.Err() != nil || !ok || sec.Type != TokenSecretType || sec.Annotations[annotationAudited] == "true" {
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
		// Recorded: marked even if the term ends meanwhile, or the next
		// leader records it again.
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
		defer cancel()
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{annotationAudited: "true"}}})
		if _, err := client.CoreV1().Secrets(namespace).Patch(mctx, sec.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			log.Warn("could not mark token record audited; it may be recorded again after a restart", "token_id", id, "error", err)
		}
	}
	reg, err := records.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: handle, UpdateFunc: func(_, o any) { handle(o) }})
	if err != nil {
		return err
	}
	context.AfterFunc(ctx, func() { _ = records.RemoveEventHandler(reg) })
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return fmt.Errorf("token watch did not sync: %w", ctx.Err())
	}
	return nil
}
