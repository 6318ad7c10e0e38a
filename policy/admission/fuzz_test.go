package admission_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzDecide feeds arbitrary JSON objects to every default rule: Decide
// must not panic, must deny whenever it fails, and must keep its bounds.
func FuzzDecide(f *testing.F) {
	for _, seed := range []string{
		`{}`,
		`{"spec": {}}`,
		`{"metadata": {"annotations": {"relaymesh.io/allow-all": "true"}}, "spec": {"sourceSelector": []}}`,
		`{"spec": {"sourceSelector": [{"kubeIdentityMatcher": {"namespaces": ["a"]}}], "destinationSelector": [{}]}}`,
		`{"spec": {"sourceSelector": "x", "destinationSelector": 7}}`,
		`{"spec": {"policy": {"faultInjection": {"abort": {"httpStatus": 503}, "percentage": 1e308}}}}`,
		`{"spec": {"mtls": {"shared": {"rootCA": {"generated": {"keyAlgorithm": "RSA2048"}}}}}}`,
		`{"spec": {"mtls": {"shared": {"rootCA": {"generated": {"keyAlgorithm": [1, {"a": null}]}}}}}}`,
		`{"metadata": null, "spec": null}`,
	} {
		for kind := range byte(4) {
			f.Add(kind, []byte(seed))
		}
	}
	e, err := admission.New(admission.Config{Recorder: &recorder{}})
	require.NoError(f, err)
	kinds := []string{"AccessPolicy", "TrafficPolicy", "VirtualMesh", "VirtualDestination"}
	ops := []string{admission.OperationCreate, admission.OperationUpdate, admission.OperationDelete}
	f.Fuzz(func(t *testing.T, kind byte, data []byte) {
		var obj map[string]any
		dec := json.NewDecoder(bytes.NewReader(data))
		if kind&0x80 != 0 {
			dec.UseNumber()
		}
		if dec.Decode(&obj) != nil || obj == nil {
			return
		}
		req := admission.Request{
			Operation: ops[int(kind>>2)%len(ops)], Kind: kinds[int(kind)%len(kinds)], Namespace: "ns", Name: "n",
			Object: obj, OldObject: obj,
			NamespaceLabels: map[string]string{"relaymesh.io/environment": "production"},
		}
		d, err := e.Decide(context.Background(), req)
		if err != nil {
			assert.True(t, errors.Is(err, admission.ErrCheckFailed), "%v", err)
			assert.False(t, d.Allowed)
		}
		assert.Equal(t, len(d.Denials) == 0, d.Allowed)
		assert.LessOrEqual(t, len(d.Denials), 64)
		for _, den := range d.Denials {
			assert.NotEmpty(t, den.Rule)
			assert.LessOrEqual(t, len(den.Message), 1024)
		}
	})
}

// FuzzWebhook feeds arbitrary bodies to the webhook handler: it must not
// panic, must answer a well-formed AdmissionReview or an HTTP error, and
// must never allow what it could not read.
func FuzzWebhook(f *testing.F) {
	for _, seed := range []string{
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":{"kind":"AccessPolicy"},"operation":"CREATE","namespace":"a","name":"b","object":{"spec":{}}}}`,
		`{"request":{"uid":"2","kind":{"kind":"TrafficPolicy"},"operation":"UPDATE","object":{"spec":{"policy":{}}},"oldObject":[]}}`,
		`{"request":{"object":"x"}}`,
		`{"request":null}`,
		`[]`,
		``,
	} {
		f.Add([]byte(seed))
	}
	engine, err := admission.New(admission.Config{Recorder: &recorder{}})
	require.NoError(f, err)
	hook := &admission.Webhook{Engine: engine}
	f.Fuzz(func(t *testing.T, body []byte) {
		w := httptest.NewRecorder()
		hook.ServeHTTP(w, fromAPIServer(httptest.NewRequest(http.MethodPost, admission.WebhookPath, bytes.NewReader(body))))
		if w.Code != http.StatusOK {
			return
		}
		var review struct {
			Response *struct {
				Allowed bool `json:"allowed"`
			} `json:"response"`
			Request json.RawMessage `json:"request"`
		}
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &review), "a 200 answer is JSON")
		require.NotNil(t, review.Response, "a 200 answer has a response")
		if review.Response.Allowed {
			var in struct {
				Request struct {
					Object map[string]any `json:"object"`
				} `json:"request"`
			}
			require.NoError(t, json.Unmarshal(body, &in), "allowed only what it could read")
		}
	})
}
