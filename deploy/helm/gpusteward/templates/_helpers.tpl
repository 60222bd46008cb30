{{- define "gpusteward.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* Release-scoped prefix of every object name, cluster-scoped ones included, so two
releases never collide. Names get suffixes such as -reclaimer-lease: keep room for them. */ -}}
{{- define "gpusteward.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpusteward.labels" -}}
{{ include "gpusteward.selector" . }}
app.kubernetes.io/version: {{ .root.Values.image.tag | default .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: gpusteward
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpusteward.selector" -}}
app.kubernetes.io/name: {{ include "gpusteward.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- /* A pod template's metadata: the component's labels and podLabels, podAnnotations and
the given checksums. (dict "root" $ "component" "extender" "values" .Values.extender
"checksums" (dict ...)) */ -}}
{{- define "gpusteward.podMetadata" -}}
labels:
  {{- include "gpusteward.labels" . | nindent 2 }}
  {{- with .values.podLabels }}{{ toYaml . | nindent 2 }}{{ end }}
{{- if or .checksums .values.podAnnotations }}
annotations:
  {{- range $key, $sum := .checksums }}
  checksum/{{ $key }}: {{ $sum }}
  {{- end }}
  {{- with .values.podAnnotations }}{{ toYaml . | nindent 2 }}{{ end }}
{{- end }}
{{- end -}}

{{- /* Scheduling values every component has: priorityClassName, nodeSelector, affinity,
tolerations. */ -}}
{{- define "gpusteward.podPlacement" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- /* The policy as a mapping: the `policy` value (a mapping, or YAML text from --set-file),
else the chart's files/policy.yaml (deploy/policy.example.yaml). */ -}}
{{- define "gpusteward.policyText" -}}
{{- $p := .Values.policy -}}
{{- if kindIs "string" $p -}}
{{- $p -}}
{{- else if $p -}}
{{- toYaml $p -}}
{{- else -}}
{{- .Files.Get "files/policy.yaml" -}}
{{- end -}}
{{- end -}}

{{- define "gpusteward.policy" -}}
{{- $policy := include "gpusteward.policyText" . | fromYaml -}}
{{- if hasKey $policy "Error" -}}
{{- fail (printf "policy is not valid YAML: %s" $policy.Error) -}}
{{- end -}}
{{- toJson $policy -}}
{{- end -}}

{{- /* The reclaimer mode in effect: the mode value, else the policy's reclaim.mode. */ -}}
{{- define "gpusteward.mode" -}}
{{- $policy := include "gpusteward.policy" . | fromJson -}}
{{- .Values.mode | default (dig "reclaim" "mode" "observe" $policy) -}}
{{- end -}}

{{- define "gpusteward.args" -}}
{{- with .root.Values.logLevel }}
- --log-level={{ . }}
{{- end }}
{{- with .root.Values.logFormat }}
- --log-format={{ . }}
{{- end }}
{{- range .values.extraArgs }}
- {{ . | quote }}
{{- end }}
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
http://{{ include "gpusteward.fullname" . }}-extender.{{ .Release.Namespace }}.svc:{{ .Values.extender.port }}
{{- end -}}

{{- /* The extenders entry of a KubeSchedulerConfiguration. managedResources: the policy's
GPU resources, so pods asking for any of them (MIG profiles too) reach the extender. */ -}}
{{- define "gpusteward.extenderEntry" -}}
{{- $policy := include "gpusteward.policy" . | fromJson -}}
filterVerb: filter
prioritizeVerb: prioritize
preemptVerb: preempt
weight: {{ .Values.scheduler.extenderWeight }}
nodeCacheCapable: true
ignorable: true
httpTimeout: {{ .Values.scheduler.httpTimeout }}
managedResources:
  {{- range $policy.resources | default (list "nvidia.com/gpu") }}
  - name: {{ . }}
    ignoredByScheduler: false
  {{- end }}
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

{{- define "gpusteward.leaseName" -}}
{{- .Values.reclaimer.leaseName | default (printf "%s-reclaimer" (include "gpusteward.fullname" .)) -}}
{{- end -}}

{{- /* The profile name GPU pods put in spec.schedulerName. */ -}}
{{- define "gpusteward.schedulerName" -}}
{{- .Values.scheduler.name | default (printf "%s-scheduler" (include "gpusteward.fullname" .)) -}}
{{- end -}}

{{- /* A component's ServiceAccount: serviceAccount.name, else <fullname>-<component> when the
chart creates it (an existing one must be named: values.schema.json). (dict "root" $
"component" "extender") */ -}}
{{- define "gpusteward.serviceAccountName" -}}
{{- $sa := (index .root.Values .component).serviceAccount -}}
{{- $sa.name | default (printf "%s-%s" (include "gpusteward.fullname" .root) .component) -}}
{{- end -}}

{{- /* The ServiceAccount object, when the chart creates it. */ -}}
{{- define "gpusteward.serviceAccount" -}}
{{- $sa := (index .root.Values .component).serviceAccount -}}
{{- if $sa.create }}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "gpusteward.serviceAccountName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels: {{- include "gpusteward.labels" . | nindent 4 }}
  {{- with $sa.annotations }}
  annotations: {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end -}}

{{- /* A CronJob running one gpusteward command on the installed policy (reports.yaml). Its pod
reads the API server only when it is the report; whatif reads Prometheus alone. (dict "root" $
"component" "report" "values" .Values.report "args" (list ...)) */ -}}
{{- define "gpusteward.cronJob" -}}
{{- $root := .root }}
{{- $values := .values }}
{{- $name := include "gpusteward.fullname" $root }}
---
apiVersion: batch/v1
kind: CronJob
metadata:
  name: {{ $name }}-{{ .component }}
  namespace: {{ $root.Release.Namespace }}
  labels: {{- include "gpusteward.labels" . | nindent 4 }}
spec:
  schedule: {{ $values.schedule | quote }}
  {{- with $values.timeZone }}
  timeZone: {{ . | quote }}
  {{- end }}
  suspend: {{ $values.suspend }}
  concurrencyPolicy: Forbid
  successfulJobsHistoryLimit: {{ $values.historyLimit }}
  failedJobsHistoryLimit: {{ $values.historyLimit }}
  jobTemplate:
    metadata:
      labels: {{- include "gpusteward.labels" . | nindent 8 }}
    spec:
      backoffLimit: 1
      activeDeadlineSeconds: {{ $values.activeDeadlineSeconds }}
      template:
        metadata:
          {{- include "gpusteward.podMetadata" (dict "root" $root "component" .component "values" $values) | nindent 10 }}
        spec:
          restartPolicy: Never
          serviceAccountName: {{ include "gpusteward.serviceAccountName" . }}
          automountServiceAccountToken: {{ eq .component "report" }}
          {{- with $root.Values.imagePullSecrets }}
          imagePullSecrets: {{- toYaml . | nindent 12 }}
          {{- end }}
          securityContext: {{- include "gpusteward.podSecurity" $root | nindent 12 }}
          {{- with include "gpusteward.podPlacement" $values | trim }}{{ . | nindent 10 }}{{ end }}
          containers:
            - name: {{ .component }}
              image: {{ include "gpusteward.image" $root }}
              imagePullPolicy: {{ $root.Values.image.pullPolicy }}
              terminationMessagePolicy: FallbackToLogsOnError
              args:
                {{- range concat .args $values.args }}
                - {{ . | quote }}
                {{- end }}
                {{- with $root.Values.prometheusUrl }}
                - --prometheus-url={{ . }}
                {{- end }}
                {{- with include "gpusteward.args" (dict "root" $root "values" $values) | trim }}{{ . | nindent 16 }}{{ end }}
              {{- with include "gpusteward.prometheusEnv" $root | trim }}
              env: {{- . | nindent 16 }}
              {{- end }}
              resources: {{- toYaml $values.resources | nindent 16 }}
              securityContext: {{- include "gpusteward.containerSecurity" $root | nindent 16 }}
              volumeMounts:
                - name: policy
                  mountPath: /etc/gpusteward
                  readOnly: true
                {{- if and (eq .component "whatif") $values.candidates }}
                - name: candidates
                  mountPath: /etc/gpusteward-whatif
                  readOnly: true
                {{- end }}
                - name: tmp
                  mountPath: /tmp
                {{- with include "gpusteward.prometheusMount" $root | trim }}
                {{- . | nindent 16 }}
                {{- end }}
          volumes:
            - name: policy
              configMap:
                name: {{ $name }}-policy
            {{- if and (eq .component "whatif") $values.candidates }}
            - name: candidates
              configMap:
                name: {{ $name }}-whatif
            {{- end }}
            - name: tmp
              emptyDir: {sizeLimit: 64Mi}
            {{- with include "gpusteward.prometheusVolume" $root | trim }}
            {{- . | nindent 12 }}
            {{- end }}
{{- end -}}
