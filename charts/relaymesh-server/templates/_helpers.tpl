{{/* Full name of the release's objects: the release name, unless it already holds the chart name. */}}
{{- define "relaymesh-server.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Name of cluster-scoped objects: unique per release namespace too. */}}
{{- define "relaymesh-server.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "relaymesh-server.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "relaymesh-server.serviceAccountName" -}}
{{- default (include "relaymesh-server.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "relaymesh-server.selectorLabels" -}}
app.kubernetes.io/name: relaymesh-server
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "relaymesh-server.labels" -}}
{{ include "relaymesh-server.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: relaymesh
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The image: repository@digest, else repository:tag (default appVersion). */}}
{{- define "relaymesh-server.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* DNS names of the server certificate: the Service's, then serverDNSNames. */}}
{{- define "relaymesh-server.dnsNames" -}}
{{- $svc := include "relaymesh-server.fullname" . -}}
{{- $names := list $svc (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace) -}}
{{- concat $names .Values.serverDNSNames | uniq | join "," -}}
{{- end -}}

{{/* The Redis the replicas keep snapshots in: snapshotStore.redis.address, else the subchart's Service. */}}
{{- define "relaymesh-server.redisAddress" -}}
{{- if .Values.snapshotStore.redis.address -}}
{{- .Values.snapshotStore.redis.address -}}
{{- else if .Values.redis.enabled -}}
{{- printf "%s-redis.%s.svc:6379" .Release.Name .Release.Namespace -}}
{{- else -}}
{{- fail "snapshotStore.type redis: set snapshotStore.redis.address, or redis.enabled for this chart's Redis" -}}
{{- end -}}
{{- end -}}
