#!/usr/bin/env bash
# Print the fake nodes of the local cluster as YAML (kwok manages them):
# 4 GPU nodes shaped like EKS p5en.48xlarge and 2 CPU nodes for the operator and router.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

GPU_NODES="${DISAGG_GPU_NODES:-4}"
CPU_NODES="${DISAGG_CPU_NODES:-2}"
REGION=us-east-2
ZONE=us-east-2a

# node NAME INSTANCE_TYPE NODEGROUP "CPU CPU_ALLOCATABLE" "MEMORY MEMORY_ALLOCATABLE" PODS
#      EXTRA_LABELS EXTRA_RESOURCES TAINTS  (the EXTRA_* and TAINTS are YAML fragments)
node() {
    local name=$1 type=$2 group=$3 pods=$6 labels=$7 resources=$8 taints=$9
    local cpu=($4) memory=($5)
    local fixed="
    pods: \"$pods\"
    ephemeral-storage: 500Gi$resources"
    cat <<YAML
---
apiVersion: v1
kind: Node
metadata:
  name: $name
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: $name
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    node.kubernetes.io/instance-type: $type
    topology.kubernetes.io/region: $REGION
    topology.kubernetes.io/zone: $ZONE
    eks.amazonaws.com/capacityType: ON_DEMAND
    eks.amazonaws.com/nodegroup: $group
    type: kwok$labels
spec:
  providerID: aws:///$ZONE/i-$(printf '%017x' "$(cksum <<<"$name" | cut -d' ' -f1)")$taints
status:
  nodeInfo:
    architecture: amd64
    operatingSystem: linux
    kubeletVersion: $KUBE_VERSION
  capacity:
    cpu: "${cpu[0]}"
    memory: ${memory[0]}$fixed
  allocatable:
    cpu: ${cpu[1]}
    memory: ${memory[1]}$fixed
YAML
}

for i in $(seq 0 $((GPU_NODES - 1))); do
    node "p5en-gpu-$i" p5en.48xlarge gpu-p5en "192 191450m" "2048Gi 2000Gi" 100 "
    k8s.amazonaws.com/accelerator: nvidia-h200
    nvidia.com/gpu.present: \"true\"
    vpc.amazonaws.com/efa.present: \"true\"" "
    nvidia.com/gpu: \"8\"
    vpc.amazonaws.com/efa: \"16\"
    hugepages-2Mi: 10Gi" "
  taints:
  - key: nvidia.com/gpu
    value: present
    effect: NoSchedule"
done
for i in $(seq 0 $((CPU_NODES - 1))); do
    node "cpu-$i" m7i.4xlarge system "16 15890m" "64Gi 61Gi" 58 "" "" ""
done
