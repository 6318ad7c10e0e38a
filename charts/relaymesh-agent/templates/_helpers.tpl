{{/* The chart's name in object names: nameOverride, else the chart name. The label app.kubernetes.io/name stays relaymesh-agent whatever it is: relaymesh dashboard and debug report find the pods by it. */}}
{{- define "relaymesh-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects: fullnameOverride; else the release name, unless it already holds the chart's name; else release-name. */}}
{{- define "relaymesh-agent.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "relaymesh-agent.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Replicas: replicaCount (the key `helm create` charts use) when set, else replicas. */}}
{{- define "relaymesh-agent.replicas" -}}
{{- if kindIs "invalid" .Values.replicaCount -}}
{{- .Values.replicas -}}
{{- else -}}
{{- .Values.replicaCount -}}
{{- end -}}
{{- end -}}

{{/* Name of cluster-scoped objects: unique per release namespace too. */}}
{{- define "relaymesh-agent.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "relaymesh-agent.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Whether the chart creates the ServiceAccount: "true" or "". Unset (values of a release made before the key, reused by helm upgrade --reuse-values) means it does, as it always did. */}}
{{- define "relaymesh-agent.createServiceAccount" -}}
{{- if or (not (kindIs "bool" .Values.serviceAccount.create)) .Values.serviceAccount.create -}}true{{- end -}}
{{- end -}}

{{/* The ServiceAccount: serviceAccount.name, else the full name (serviceAccount.create=false requires a name: the schema says so). */}}
{{- define "relaymesh-agent.serviceAccountName" -}}
{{- if and (not (include "relaymesh-agent.createServiceAccount" .)) (not .Values.serviceAccount.name) -}}
{{- fail "serviceAccount.create=false: set serviceAccount.name to the ServiceAccount you created" -}}
{{- end -}}
{{- default (include "relaymesh-agent.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "relaymesh-agent.selectorLabels" -}}
app.kubernetes.io/name: relaymesh-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "relaymesh-agent.labels" -}}
{{ include "relaymesh-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: relaymesh
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The image: repository@digest, else repository:tag (default appVersion). */}}
{{- define "relaymesh-agent.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}
