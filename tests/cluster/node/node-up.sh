#!/usr/bin/env bash
# Start the real node of the running local cluster, or keep it when it already runs for it:
# containerd (runc, CNI bridge), the kubelet and kube-proxy (nftables), all inside the network
# namespace $NODE_NETNS, joined to the host by one veth pair; the pause image (images.sh) loaded
# into containerd (`images.sh build && images.sh import` loads the project's images). The node
# registers as $NODE_NAME, tainted $NODE_TAINT, labelled type=real.
# Run by cluster-up.sh when DISAGG_REAL_NODE=1 (the control plane must have been created with
# kwokctl-config.sh's settings); stopped by node-down.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"

PKI="$CLUSTER_STATE/kwok/clusters/$CLUSTER_NAME/pki"
kubectl=("$CLUSTER_BIN/kubectl" --kubeconfig "$CLUSTER_KUBECONFIG")
ctr=("$NODE_BIN/ctr" --address "$NODE_RUN/containerd.sock")
in_netns=(nsenter "--net=/run/netns/$NODE_NETNS" --)
start=$(date +%s)

if [[ $(id -u) -ne 0 ]]; then
    echo "node-up: the real node needs root (network namespace, cgroups, mounts)" >&2
    exit 1
fi
if ! grep -q -- "--advertise-address=$NODE_HOST_IP" \
    "$CLUSTER_STATE/kwok/clusters/$CLUSTER_NAME/kwok.yaml" 2>/dev/null; then
    echo "node-up: cluster $CLUSTER_NAME was created without the real node's settings" \
        "(kwokctl-config.sh); recreate it with DISAGG_REAL_NODE=1 (make cluster-down first)" >&2
    exit 1
fi

"$NODE_SRC/build-node.sh" >&2
"$NODE_SRC/images.sh" build pause >&2
eval "$("$NODE_SRC/images.sh" env)"

alive() { node_pid "$1" "$NODE_BIN" >/dev/null; } # alive NAME: it runs this cache's binary

node_ready() {
    [[ "$("${kubectl[@]}" get node "$NODE_NAME" \
        -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

WAIT_LOGS="$NODE_STATE/logs"

owner=$(cat "$NODE_OWNER" 2>/dev/null || true)
if [[ "$owner" == "$CLUSTER_STATE" ]] && alive containerd && alive kubelet && alive kube-proxy &&
    node_ready; then
    echo "node-up: reusing real node $NODE_NAME" >&2
    "$NODE_SRC/images.sh" import pause >&2
    exit 0
fi
if [[ -n "$owner" && "$owner" != "$CLUSTER_STATE" ]] && node_pid kubelet >/dev/null; then
    echo "node-up: the real node runs for the cluster in $owner; only one runs per machine" >&2
    exit 1
fi
"$NODE_SRC/node-down.sh" >&2

mkdir -p "$NODE_STATE"/{logs,certs,cni,kubelet,pod-logs} "$NODE_RUN"
echo "$CLUSTER_STATE" >"$NODE_OWNER"

# --- credentials: client certificates signed by the cluster's CA ---------------------------
client_cert() { # client_cert NAME CN [O]
    local name=$1 subject="/CN=$2${3:+/O=$3}" dir="$NODE_STATE/certs"
    openssl req -new -newkey rsa:2048 -nodes -subj "$subject" \
        -keyout "$dir/$name.key" -out "$dir/$name.csr" 2>/dev/null
    openssl x509 -req -in "$dir/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
        -set_serial "0x$(openssl rand -hex 8)" -days 30 -out "$dir/$name.crt" \
        -extfile <(printf 'keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n') \
        2>/dev/null
    rm -f "$dir/$name.csr"
}
port=$(sed -n 's#^ *server: https://127.0.0.1:\([0-9]*\)$#\1#p' "$CLUSTER_KUBECONFIG")
kubeconfig() { # kubeconfig NAME: the component reaches the API server over the veth link
    cat >"$NODE_STATE/$1.kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    certificate-authority: $PKI/ca.crt
    server: https://$NODE_HOST_IP:$port
users:
- name: $1
  user:
    client-certificate: $NODE_STATE/certs/$1.crt
    client-key: $NODE_STATE/certs/$1.key
contexts:
- name: local
  context: {cluster: local, user: $1}
current-context: local
YAML
}
client_cert kubelet "system:node:$NODE_NAME" system:nodes
client_cert kube-proxy system:kube-proxy
kubeconfig kubelet
kubeconfig kube-proxy

# --- network: the node's namespace, its veth link to the host, routes to pods and Services ----
ip netns add "$NODE_NETNS"
ip link add "$NODE_HOST_LINK" type veth peer name eth0 netns "$NODE_NETNS"
ip addr add "$NODE_HOST_IP/$NODE_LINK_PREFIX" dev "$NODE_HOST_LINK"
ip link set "$NODE_HOST_LINK" up
"${in_netns[@]}" ip link set lo up
"${in_netns[@]}" ip addr add "$NODE_IP/$NODE_LINK_PREFIX" dev eth0
"${in_netns[@]}" ip link set eth0 up
# The host reaches pods and ClusterIPs through the node (tests, the API server's proxy).
ip route add "$POD_CIDR" via "$NODE_IP" dev "$NODE_HOST_LINK"
ip route add "$SERVICE_CIDR" via "$NODE_IP" dev "$NODE_HOST_LINK"
# Inside the namespace only: route between the link and the bridge, and let bridged pod
# traffic through netfilter so that Service replies between two pods on the bridge are
# translated back.
"${in_netns[@]}" sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
: >"$NODE_STATE/resolv.conf"

cat >"$NODE_STATE/cni/10-disagg-node.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "disagg-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "isDefaultGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GATEWAY"}]],
        "dataDir": "$NODE_RUN/cni-ipam"
      }
    },
    {"type": "portmap", "backend": "nftables", "capabilities": {"portMappings": true}}
  ]
}
JSON

# --- cgroups: everything the node runs sits under /disagg-node in each v1 hierarchy ---------
for hierarchy in /sys/fs/cgroup/*/; do
    [[ "$(stat -f -c %T "$hierarchy")" == cgroupfs ]] || continue # v1 hierarchies only
    mkdir -p "$hierarchy/disagg-node"
done
cp /sys/fs/cgroup/cpuset/cpuset.cpus /sys/fs/cgroup/cpuset/disagg-node/cpuset.cpus
cp /sys/fs/cgroup/cpuset/cpuset.mems /sys/fs/cgroup/cpuset/disagg-node/cpuset.mems

# --- containerd ------------------------------------------------------------------------------
cat >"$NODE_STATE/containerd.toml" <<TOML
version = 3
root = "$NODE_STATE/containerd"
state = "$NODE_RUN/containerd"

[grpc]
  address = "$NODE_RUN/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "$NODE_STATE/opt"

[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"

[plugins."io.containerd.cri.v1.runtime"]
  netns_mounts_under_state_dir = true
  # Root here lacks CAP_SYS_RESOURCE: no container may get a lower OOM score than containerd's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$NODE_BIN"]
    conf_dir = "$NODE_STATE/cni"
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
TOML

# launch NAME ARGS...: run the node binary NAME inside the namespace, detached, logging to
# $NODE_STATE/logs/NAME.log (none inherits cluster-up's lock on fd 8).
launch() {
    local name=$1
    shift
    PATH="$NODE_BIN:$PATH" setsid "${in_netns[@]}" "$NODE_BIN/$name" "$@" \
        >"$NODE_STATE/logs/$name.log" 2>&1 </dev/null 8>&- &
    echo $! >"$NODE_RUN/$name.pid"
}

launch containerd --config "$NODE_STATE/containerd.toml"
wait_for containerd 60 "${ctr[@]}" version
"$NODE_SRC/images.sh" import pause >&2

# --- kubelet ---------------------------------------------------------------------------------
taint_key=${NODE_TAINT%%=*}
taint_value=${NODE_TAINT#*=}
taint_value=${taint_value%%:*}
cat >"$NODE_STATE/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts the cgroup v1 hierarchies; kubelet >= 1.35 refuses them unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /disagg-node
containerRuntimeEndpoint: unix://$NODE_RUN/containerd.sock
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
resolvConf: $NODE_STATE/resolv.conf
registerWithTaints:
- {key: $taint_key, value: "$taint_value", effect: NoSchedule}
podLogsDir: $NODE_STATE/pod-logs
maxPods: 32
failSwapOn: false
serializeImagePulls: false
# The images cannot be pulled back: never garbage-collect them, evict only when nearly full.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 256Mi
  nodefs.available: 2%
  imagefs.available: 2%
  nodefs.inodesFree: 2%
YAML
# The fake nodes' region and zone: pods that keep prefill and decode in one zone land here too.
labels=type=real
for key in topology.kubernetes.io/region topology.kubernetes.io/zone; do
    value=$("${kubectl[@]}" get nodes -l type=kwok -o "jsonpath={.items[0].metadata.labels.${key//./\\.}}")
    if [[ -n "$value" ]]; then labels+=",$key=$value"; fi
done
launch kubelet --config="$NODE_STATE/kubelet.yaml" \
    --kubeconfig="$NODE_STATE/kubelet.kubeconfig" \
    --root-dir="$NODE_STATE/kubelet" --cert-dir="$NODE_STATE/certs/kubelet" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --node-labels="$labels" --v=1
wait_for "kubelet (node $NODE_NAME Ready)" 120 node_ready

# --- kube-proxy ------------------------------------------------------------------------------
cat >"$NODE_STATE/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: $NODE_NAME
clientConnection: {kubeconfig: $NODE_STATE/kube-proxy.kubeconfig}
clusterCIDR: $POD_CIDR
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# The conntrack table is the machine's: leave its size and timeouts alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
launch kube-proxy --config="$NODE_STATE/kube-proxy.yaml" --v=1
proxy_healthy() {
    "${in_netns[@]}" curl -fsS --max-time 2 http://127.0.0.1:10256/healthz >/dev/null 2>&1
}
wait_for kube-proxy 60 proxy_healthy

echo "node-up: $NODE_NAME Ready in $(($(date +%s) - start)) s (pods on $POD_CIDR in netns" \
    "$NODE_NETNS; logs in $NODE_STATE/logs)" >&2
