#!/usr/bin/env bash
# Print the kwokctl configuration of a control plane that takes a real node (kwokctl --config):
#   - kwok manages only the nodes annotated kwok.x-k8s.io/node=fake (nodes.sh sets it), so it
#     leaves the real node and its pods to the kubelet;
#   - the API server advertises the host end of the node's veth link (pods reach it through
#     the `kubernetes` Service) and its certificate names that address and the Service's IP;
#   - the API server reaches the kubelet (logs, exec, port-forward) at the node's InternalIP
#     (its name resolves nowhere) and authenticates with the admin certificate kwokctl makes.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"

pki="$CLUSTER_STATE/kwok/clusters/$CLUSTER_NAME/pki"
cat <<YAML
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  kubeApiserverCertSANs:
  - $NODE_HOST_IP
  - $KUBERNETES_SERVICE_IP
componentsPatches:
- name: kube-apiserver
  extraArgs:
  - key: advertise-address
    value: $NODE_HOST_IP
  - key: service-cluster-ip-range
    value: $SERVICE_CIDR
  - key: kubelet-preferred-address-types
    value: InternalIP
  - key: kubelet-client-certificate
    value: $pki/admin.crt
  - key: kubelet-client-key
    value: $pki/admin.key
- name: kwok-controller
  extraArgs:
  - key: manage-all-nodes
    value: "false"
    override: true
  - key: manage-nodes-with-annotation-selector
    value: kwok.x-k8s.io/node=fake
YAML
