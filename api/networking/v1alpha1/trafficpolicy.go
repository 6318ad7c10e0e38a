package v1alpha1

import (
	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TrafficPolicy shapes requests from selected workloads to selected
// Destinations: traffic shifting, faults, timeouts, retries, CORS, mirroring,
// header edits, outlier detection and TLS mode.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rmtp,categories=relaymesh
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TrafficPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TrafficPolicySpec `json:"spec"`
	Status PolicyStatus      `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// TrafficPolicyList is a list of TrafficPolicies.
type TrafficPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TrafficPolicy `json:"items"`
}

// TrafficPolicySpec is what a TrafficPolicy asks for.
type TrafficPolicySpec struct {
	// SourceSelector chooses the client workloads; omitted: all workloads. The
	// policy is emitted only into the clusters its sources run in.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	SourceSelector []common.WorkloadSelector `json:"sourceSelector,omitempty"`
	// DestinationSelector chooses the Destinations; omitted: all.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	DestinationSelector []common.DestinationSelector `json:"destinationSelector,omitempty"`
	// HTTPRequestMatchers restrict the policy to matching requests: every
	// field of one matcher must match (AND), any matcher may match (OR).
	// +kubebuilder:validation:MaxItems=64
	// +optional
	HTTPRequestMatchers []HTTPMatcher `json:"httpRequestMatchers,omitempty"`
	// Policy is what to do with matching requests.
	Policy Policy `json:"policy"`
}

// HTTPMatcher matches an HTTP request.
type HTTPMatcher struct {
	// URI matches the request path.
	// +optional
	URI *StringMatch `json:"uri,omitempty"`
	// Headers the request must carry.
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Headers []HeaderMatcher `json:"headers,omitempty"`
	// QueryParameters the request must carry.
	// +kubebuilder:validation:MaxItems=32
	// +optional
	QueryParameters []QueryParameterMatcher `json:"queryParameters,omitempty"`
	// Method of the request.
	// +kubebuilder:validation:Enum=GET;HEAD;POST;PUT;DELETE;CONNECT;OPTIONS;TRACE;PATCH
	// +optional
	Method string `json:"method,omitempty"`
}

// StringMatch matches a string exactly, by prefix, or by RE2 regular
// expression; exactly one field is set.
// +kubebuilder:validation:XValidation:rule="(has(self.exact) ? 1 : 0) + (has(self.prefix) ? 1 : 0) + (has(self.regex) ? 1 : 0) == 1",message="exactly one of exact, prefix or regex must be set"
type StringMatch struct {
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Exact *string `json:"exact,omitempty"`
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Prefix *string `json:"prefix,omitempty"`
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Regex *string `json:"regex,omitempty"`
}

// HeaderMatcher matches one request header.
type HeaderMatcher struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`
	// Value to match; empty matches any value.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Value string `json:"value,omitempty"`
	// Regex treats Value as an RE2 regular expression.
	// +optional
	Regex bool `json:"regex,omitempty"`
	// InvertMatch matches requests that do not match.
	// +optional
	InvertMatch bool `json:"invertMatch,omitempty"`
}

// QueryParameterMatcher matches one query parameter.
type QueryParameterMatcher struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Value string `json:"value,omitempty"`
	// +optional
	Regex bool `json:"regex,omitempty"`
}

// Policy is the behaviour a TrafficPolicy applies.
type Policy struct {
	// +optional
	TrafficShift *TrafficShift `json:"trafficShift,omitempty"`
	// +optional
	FaultInjection *FaultInjection `json:"faultInjection,omitempty"`
	// RequestTimeout for the whole request, a Go duration.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="must be a Go duration such as 30s, 1m30s or 8760h (units h, m, s, ms, us, ns)"
	// +optional
	RequestTimeout *metav1.Duration `json:"requestTimeout,omitempty"`
	// +optional
	Retries *RetryPolicy `json:"retries,omitempty"`
	// +optional
	CORSPolicy *CORSPolicy `json:"corsPolicy,omitempty"`
	// +optional
	Mirror *Mirror `json:"mirror,omitempty"`
	// +optional
	HeaderManipulation *HeaderManipulation `json:"headerManipulation,omitempty"`
	// +optional
	OutlierDetection *OutlierDetection `json:"outlierDetection,omitempty"`
	// +optional
	MTLS *MTLSPolicy `json:"mtls,omitempty"`
}

// TrafficShift splits traffic across weighted destinations.
type TrafficShift struct {
	// Destinations and their weights; weights must sum to 100.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	Destinations []WeightedDestination `json:"destinations"`
}

// WeightedDestination is one target of a traffic shift; exactly one of
// kubeService or virtualDestination is set.
// +kubebuilder:validation:XValidation:rule="has(self.kubeService) != has(self.virtualDestination)",message="exactly one of kubeService or virtualDestination must be set"
type WeightedDestination struct {
	// Weight in percent.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Weight int32 `json:"weight"`
	// +optional
	KubeService *KubeServiceTarget `json:"kubeService,omitempty"`
	// +optional
	VirtualDestination *VirtualDestinationTarget `json:"virtualDestination,omitempty"`
}

// KubeServiceTarget is a Service in some cluster, optionally one subset and port.
type KubeServiceTarget struct {
	common.ClusterObjectRef `json:",inline"`
	// Subset selects the pods carrying these labels.
	// +optional
	Subset map[string]string `json:"subset,omitempty"`
	// Port of the Service; omitted: the port of the request.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
}

// VirtualDestinationTarget is a VirtualDestination, optionally one subset.
type VirtualDestinationTarget struct {
	common.ObjectRef `json:",inline"`
	// +optional
	Subset map[string]string `json:"subset,omitempty"`
}

// FaultInjection delays or aborts a percentage of requests; exactly one of
// fixedDelay or abort is set.
// +kubebuilder:validation:XValidation:rule="has(self.fixedDelay) != has(self.abort)",message="exactly one of fixedDelay or abort must be set"
type FaultInjection struct {
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="must be a Go duration such as 30s, 1m30s or 8760h (units h, m, s, ms, us, ns)"
	// +optional
	FixedDelay *metav1.Duration `json:"fixedDelay,omitempty"`
	// +optional
	Abort *Abort `json:"abort,omitempty"`
	// Percentage of requests affected.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Percentage float64 `json:"percentage"`
}

// Abort fails the request with an HTTP status.
type Abort struct {
	// +kubebuilder:validation:Minimum=200
	// +kubebuilder:validation:Maximum=599
	HTTPStatus int32 `json:"httpStatus"`
}

// RetryPolicy retries failed requests.
type RetryPolicy struct {
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Attempts int32 `json:"attempts"`
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="must be a Go duration such as 30s, 1m30s or 8760h (units h, m, s, ms, us, ns)"
	// +optional
	PerTryTimeout *metav1.Duration `json:"perTryTimeout,omitempty"`
	// RetryOn lists Envoy retry conditions.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Enum="5xx";gateway-error;reset;connect-failure;envoy-ratelimited;retriable-4xx;refused-stream;retriable-status-codes;retriable-headers;cancelled;deadline-exceeded;internal;resource-exhausted;unavailable
	// +optional
	RetryOn []string `json:"retryOn,omitempty"`
}

// CORSPolicy answers cross-origin requests.
type CORSPolicy struct {
	// +kubebuilder:validation:MaxItems=64
	// +optional
	AllowOrigins []StringMatch `json:"allowOrigins,omitempty"`
	// +kubebuilder:validation:MaxItems=16
	// +optional
	AllowMethods []string `json:"allowMethods,omitempty"`
	// +kubebuilder:validation:MaxItems=64
	// +optional
	AllowHeaders []string `json:"allowHeaders,omitempty"`
	// +kubebuilder:validation:MaxItems=64
	// +optional
	ExposeHeaders []string `json:"exposeHeaders,omitempty"`
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="must be a Go duration such as 30s, 1m30s or 8760h (units h, m, s, ms, us, ns)"
	// +optional
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`
	// +optional
	AllowCredentials *bool `json:"allowCredentials,omitempty"`
}

// Mirror copies a percentage of requests to another Service.
type Mirror struct {
	KubeService common.ClusterObjectRef `json:"kubeService"`
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Percentage float64 `json:"percentage"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
}

// HeaderManipulation adds and removes request and response headers.
type HeaderManipulation struct {
	// +kubebuilder:validation:MaxItems=64
	// +optional
	RemoveRequestHeaders []string `json:"removeRequestHeaders,omitempty"`
	// +optional
	AppendRequestHeaders map[string]string `json:"appendRequestHeaders,omitempty"`
	// +kubebuilder:validation:MaxItems=64
	// +optional
	RemoveResponseHeaders []string `json:"removeResponseHeaders,omitempty"`
	// +optional
	AppendResponseHeaders map[string]string `json:"appendResponseHeaders,omitempty"`
}

// OutlierDetection ejects failing endpoints. Defaults: 5 errors, 10s
// interval, 30s ejection, 100%.
type OutlierDetection struct {
	// +kubebuilder:validation:Minimum=1
	// +optional
	ConsecutiveErrors int32 `json:"consecutiveErrors,omitempty"`
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="must be a Go duration such as 30s, 1m30s or 8760h (units h, m, s, ms, us, ns)"
	// +optional
	Interval *metav1.Duration `json:"interval,omitempty"`
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="must be a Go duration such as 30s, 1m30s or 8760h (units h, m, s, ms, us, ns)"
	// +optional
	BaseEjectionTime *metav1.Duration `json:"baseEjectionTime,omitempty"`
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxEjectionPercent *int32 `json:"maxEjectionPercent,omitempty"`
}

// MTLSPolicy sets the TLS mode of traffic to the Destination.
type MTLSPolicy struct {
	// +kubebuilder:validation:Enum=DISABLE;SIMPLE;ISTIO_MUTUAL
	TLSMode string `json:"tlsMode"`
}

// PolicyStatus is what Relaymesh made of a TrafficPolicy, AccessPolicy or
// VirtualDestination.
type PolicyStatus struct {
	common.Status `json:",inline"`
	// Destinations is the verdict per selected Destination: at most 256,
	// those not Accepted first; DestinationCount counts them all.
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Destinations []common.TargetStatus `json:"destinations,omitempty"`
	// DestinationCount is the number of selected Destinations.
	// +optional
	DestinationCount int32 `json:"destinationCount,omitempty"`
	// Workloads are the selected source workloads: at most 64 names, then
	// "… and N more"; WorkloadCount counts them all.
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Workloads []string `json:"workloads,omitempty"`
	// WorkloadCount is the number of selected source workloads.
	// +optional
	WorkloadCount int32 `json:"workloadCount,omitempty"`
}
