{{- define "gpusteward.name" -}}
{{- default "gpusteward" .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpusteward.labels" -}}
app.kubernetes.io/name: {{ include "gpusteward.name" .root }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: gpusteward
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "gpusteward.selector" -}}
app.kubernetes.io/name: {{ include "gpusteward.name" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpusteward.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "gpusteward.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpusteward.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "gpusteward.extenderURL" -}}
http://{{ include "gpusteward.name" . }}-extender.{{ .Release.Namespace }}.svc:{{ .Values.extender.port }}
{{- end -}}

{{- define "gpusteward.extenderEntry" -}}
filterVerb: filter
prioritizeVerb: prioritize
preemptVerb: preempt
weight: {{ .Values.scheduler.extenderWeight }}
nodeCacheCapable: true
ignorable: true
httpTimeout: {{ .Values.scheduler.httpTimeout }}
managedResources:
  - name: nvidia.com/gpu
    ignoredByScheduler: false
{{- end -}}

{{- /* How the extender and the reclaimer reach Prometheus (values: prometheusConnection):
environment variables for the flags, and one projected volume for the CA and credentials. */ -}}
{{- define "gpusteward.prometheusFiles" -}}
{{- $c := .Values.prometheusConnection -}}
{{- if $c.caSecret.name }}
- secret:
    name: {{ $c.caSecret.name }}
    items: [{key: {{ $c.caSecret.key }}, path: ca.crt}]
{{- end }}
{{- if $c.serviceAccountToken.enabled }}
- serviceAccountToken:
    path: token
    expirationSeconds: {{ $c.serviceAccountToken.expirationSeconds }}
    {{- with $c.serviceAccountToken.audience }}
    audience: {{ . }}
    {{- end }}
{{- else if $c.bearerTokenSecret.name }}
- secret:
    name: {{ $c.bearerTokenSecret.name }}
    items: [{key: {{ $c.bearerTokenSecret.key }}, path: token}]
{{- end }}
{{- if $c.basicAuth.passwordSecret.name }}
- secret:
    name: {{ $c.basicAuth.passwordSecret.name }}
    items: [{key: {{ $c.basicAuth.passwordSecret.key }}, path: password}]
{{- end }}
{{- end -}}

{{- define "gpusteward.prometheusEnv" -}}
{{- $c := .Values.prometheusConnection -}}
{{- $dir := "/var/run/secrets/gpusteward/prometheus" -}}
{{- if $c.caSecret.name }}
- name: GPUSTEWARD_PROMETHEUS_CA_FILE
  value: {{ $dir }}/ca.crt
{{- end }}
{{- if $c.insecureSkipVerify }}
- name: GPUSTEWARD_PROMETHEUS_INSECURE_SKIP_VERIFY
  value: "true"
{{- end }}
{{- if or $c.serviceAccountToken.enabled $c.bearerTokenSecret.name }}
- name: GPUSTEWARD_PROMETHEUS_BEARER_TOKEN_FILE
  value: {{ $dir }}/token
{{- end }}
{{- if $c.basicAuth.user }}
- name: GPUSTEWARD_PROMETHEUS_BASIC_AUTH_USER
  value: {{ $c.basicAuth.user | quote }}
- name: GPUSTEWARD_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE
  value: {{ $dir }}/password
{{- end }}
{{- with $c.headers }}
- name: GPUSTEWARD_PROMETHEUS_HEADERS
  value: {{ include "gpusteward.headerLines" . | quote }}
{{- end }}
{{- end -}}

{{- define "gpusteward.headerLines" -}}
{{- $lines := list -}}
{{- range $name, $value := . -}}
{{- $lines = append $lines (printf "%s: %s" $name $value) -}}
{{- end -}}
{{- join "\n" $lines -}}
{{- end -}}

{{- define "gpusteward.prometheusMount" -}}
{{- if include "gpusteward.prometheusFiles" . }}
- name: prometheus-credentials
  mountPath: /var/run/secrets/gpusteward/prometheus
  readOnly: true
{{- end }}
{{- end -}}

{{- define "gpusteward.prometheusVolume" -}}
{{- with include "gpusteward.prometheusFiles" . | trim }}
- name: prometheus-credentials
  projected:
    sources: {{- . | nindent 6 }}
{{- end }}
{{- end -}}
