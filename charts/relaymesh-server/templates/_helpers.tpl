{{/* The chart's name in object names: nameOverride, else the chart name. The label app.kubernetes.io/name stays relaymesh-server whatever it is: relaymesh dashboard and debug report find the pods by it. */}}
{{- define "relaymesh-server.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects: fullnameOverride; else the release name, unless it already holds the chart's name; else release-name. */}}
{{- define "relaymesh-server.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "relaymesh-server.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Replicas: replicaCount (the key `helm create` charts use) when set, else replicas. */}}
{{- define "relaymesh-server.replicas" -}}
{{- if kindIs "invalid" .Values.replicaCount -}}
{{- .Values.replicas -}}
{{- else -}}
{{- .Values.replicaCount -}}
{{- end -}}
{{- end -}}

{{/* Name of cluster-scoped objects: unique per release namespace too. */}}
{{- define "relaymesh-server.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "relaymesh-server.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Whether the chart creates the ServiceAccount: "true" or "". Unset (values of a release made before the key, reused by helm upgrade --reuse-values) means it does, as it always did. */}}
{{- define "relaymesh-server.createServiceAccount" -}}
{{- if or (not (kindIs "bool" .Values.serviceAccount.create)) .Values.serviceAccount.create -}}true{{- end -}}
{{- end -}}

{{/* The ServiceAccount: serviceAccount.name, else the full name (serviceAccount.create=false requires a name: the schema says so). */}}
{{- define "relaymesh-server.serviceAccountName" -}}
{{- if and (not (include "relaymesh-server.createServiceAccount" .)) (not .Values.serviceAccount.name) -}}
{{- fail "serviceAccount.create=false: set serviceAccount.name to the ServiceAccount you created" -}}
{{- end -}}
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

{{/* The webhook's caller check: exactly one of clientCAConfigMap and (WEAKER) allowUnauthenticated. A template rule, not the schema's: its message can say what to do. */}}
{{- define "relaymesh-server.checkWebhook" -}}
{{- if .Values.webhook.enabled -}}
{{- if and .Values.webhook.allowUnauthenticated .Values.webhook.clientCAConfigMap -}}
{{- fail "webhook: set either webhook.clientCAConfigMap (the webhook answers only your kube-apiserver's client certificate) or, WEAKER, webhook.allowUnauthenticated=true, not both" -}}
{{- end -}}
{{- if not (or .Values.webhook.allowUnauthenticated .Values.webhook.clientCAConfigMap) -}}
{{- fail "webhook.enabled=true needs webhook.clientCAConfigMap: a ConfigMap of the release namespace whose key ca.crt holds the CA of the client certificate your kube-apiserver presents to admission webhooks (or, WEAKER, webhook.allowUnauthenticated=true for an apiserver that presents none)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
