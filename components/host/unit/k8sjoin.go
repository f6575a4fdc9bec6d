package unit

import (
	"context"
	"encoding/json"
	"fmt"
)

// K8sJoin is k8s-join: joining the node to a Kubernetes cluster with
// kubeadm. It is not in this build: a spec that names it gets the unit
// failed with ErrUnsupported, and the other units go on.
type K8sJoin struct{}

func (K8sJoin) Name() string { return "k8s-join" }

// Check takes any JSON object: the settings are not defined yet, and a
// spec naming the unit is not refused for it.
func (K8sJoin) Check(body json.RawMessage) error {
	var v map[string]json.RawMessage
	return decode(body, &v)
}

func (K8sJoin) Plan(_ context.Context, _ System, body json.RawMessage) (Plan, error) {
	if absent(body) {
		return Plan{}, nil
	}
	return Plan{}, fmt.Errorf("%w: k8s-join waits for the Kubernetes work (docs/host.md); join the node with kubeadm yourself", ErrUnsupported)
}

func (K8sJoin) Apply(context.Context, System, json.RawMessage, Plan) error { return nil }
