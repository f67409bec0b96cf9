# shellcheck shell=bash
# lib.sh: configuration and helpers shared by the test cluster's scripts
# (up, down, env, restart-apiserver). Sourced, never run.
#
# Every name, port, CIDR and path below can be overridden by the
# environment, so a second cluster can run beside the first one: give it
# another KNOTLESS_CLUSTER_NAME, ports and CIDRs.

KTC_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Identity. The name prefixes the run directory, the node's network
# namespace, the cgroup root and the CNI network, so that cleanup touches
# only what carries it.
KTC_NAME=${KNOTLESS_CLUSTER_NAME:-knotless-test}
KTC_NODE_NAME=${KNOTLESS_CLUSTER_NODE_NAME:-${KTC_NAME}-node}
KTC_DIR=${KNOTLESS_CLUSTER_DIR:-/var/lib/${KTC_NAME}}
KTC_CACHE=${KNOTLESS_CLUSTER_CACHE:-/var/cache/knotless-test-cluster}
KTC_NETNS=${KNOTLESS_CLUSTER_NETNS:-${KTC_NAME}-node}
KTC_CGROUP_ROOT=${KNOTLESS_CLUSTER_CGROUP_ROOT:-/${KTC_NAME}}
KTC_CNI_NETWORK=${KNOTLESS_CLUSTER_CNI_NETWORK:-${KTC_NAME}-pods}

# Network. The node (containerd, kubelet, kube-router and every pod) lives
# in its own network namespace, joined to the host by one veth pair:
# HOST_VETH (HOST_IP, in the host) <-> NODE_VETH (NODE_IP, the node IP).
KTC_HOST_VETH=${KNOTLESS_CLUSTER_HOST_VETH:-ktc0-host}
KTC_NODE_VETH=${KNOTLESS_CLUSTER_NODE_VETH:-ktc0-node}
KTC_LINK_CIDR=${KNOTLESS_CLUSTER_LINK_CIDR:-10.223.255.0/30}
KTC_HOST_IP=${KNOTLESS_CLUSTER_HOST_IP:-10.223.255.1}
KTC_NODE_IP=${KNOTLESS_CLUSTER_NODE_IP:-10.223.255.2}
KTC_POD_BRIDGE=${KNOTLESS_CLUSTER_POD_BRIDGE:-ktc0-pods}
KTC_POD_CIDR=${KNOTLESS_CLUSTER_POD_CIDR:-10.223.0.0/24}
KTC_SERVICE_CIDR=${KNOTLESS_CLUSTER_SERVICE_CIDR:-10.223.128.0/24}
KTC_SERVICE_IP=${KNOTLESS_CLUSTER_SERVICE_IP:-10.223.128.1}
# The cluster's prefixes get an "unreachable" route in the host with this
# metric, under the veth's own route: should the veth go, nothing bound
# for them follows the default route off the machine.
KTC_ROUTE_METRIC=${KNOTLESS_CLUSTER_ROUTE_METRIC:-4223}

# ktc_ip2int and ktc_int2ip convert a dotted IPv4 address to a number
# and back.
ktc_ip2int() {
	local IFS=. a b c d
	read -r a b c d <<<"$1"
	echo $(((a << 24) | (b << 16) | (c << 8) | d))
}
ktc_int2ip() { echo "$(($1 >> 24 & 255)).$(($1 >> 16 & 255)).$(($1 >> 8 & 255)).$(($1 & 255))"; }

# The cluster's pod prefix, which kube-controller-manager carves into one
# POD_CIDR-sized prefix per node: by default POD_CIDR and the one above
# it, so the first node, registered first, gets POD_CIDR (the lowest free
# one) and the optional second node (add-node) gets the other. A POD_CIDR
# that is the upper half of its parent has no room above it: the cluster
# prefix is then POD_CIDR alone, and add-node refuses.
ktc_pod_mask=${KTC_POD_CIDR#*/}
ktc_pod_net=$(ktc_ip2int "${KTC_POD_CIDR%/*}")
if ((ktc_pod_mask > 1 && (ktc_pod_net & (1 << (32 - ktc_pod_mask))) == 0)); then
	KTC_CLUSTER_CIDR=${KNOTLESS_CLUSTER_CLUSTER_CIDR:-${KTC_POD_CIDR%/*}/$((ktc_pod_mask - 1))}
	KTC_NODE2_POD_CIDR=${KNOTLESS_CLUSTER_NODE2_POD_CIDR:-$(ktc_int2ip $((ktc_pod_net + (1 << (32 - ktc_pod_mask)))))/$ktc_pod_mask}
else
	KTC_CLUSTER_CIDR=${KNOTLESS_CLUSTER_CLUSTER_CIDR:-$KTC_POD_CIDR}
	KTC_NODE2_POD_CIDR=${KNOTLESS_CLUSTER_NODE2_POD_CIDR:-}
fi

# The optional second node (add-node; remove-node is its loss): a
# containerd, kubelet and kube-router of its own in a network namespace
# of its own, joined to the host by its own veth pair (NODE2_HOST_VETH,
# NODE2_HOST_IP <-> NODE2_NODE_VETH, NODE2_IP) and to the first node's
# namespace by another (PEER_VETH1, PEER_IP1 <-> PEER_VETH2, PEER_IP2),
# which carries the traffic between the two nodes' pods. Its run
# directory is inside the cluster's, so down removes it with the rest.
# The link prefixes default to the two /30s after LINK_CIDR.
ktc_link_net=$(ktc_ip2int "${KTC_LINK_CIDR%/*}")
KTC_NODE2_NAME=${KNOTLESS_CLUSTER_NODE2_NAME:-${KTC_NAME}-node2}
KTC_NODE2_NETNS=${KNOTLESS_CLUSTER_NODE2_NETNS:-${KTC_NAME}-node2}
KTC_NODE2_DIR=$KTC_DIR/node2
KTC_NODE2_CGROUP_ROOT=${KNOTLESS_CLUSTER_NODE2_CGROUP_ROOT:-/${KTC_NAME}-node2}
KTC_NODE2_CNI_NETWORK=${KNOTLESS_CLUSTER_NODE2_CNI_NETWORK:-${KTC_NAME}-node2-pods}
KTC_NODE2_HOST_VETH=${KNOTLESS_CLUSTER_NODE2_HOST_VETH:-ktc1-host}
KTC_NODE2_NODE_VETH=${KNOTLESS_CLUSTER_NODE2_NODE_VETH:-ktc1-node}
KTC_NODE2_POD_BRIDGE=${KNOTLESS_CLUSTER_NODE2_POD_BRIDGE:-ktc1-pods}
KTC_NODE2_LINK_CIDR=${KNOTLESS_CLUSTER_NODE2_LINK_CIDR:-$(ktc_int2ip $((ktc_link_net + 4)))/30}
KTC_NODE2_HOST_IP=${KNOTLESS_CLUSTER_NODE2_HOST_IP:-$(ktc_int2ip $((ktc_link_net + 5)))}
KTC_NODE2_IP=${KNOTLESS_CLUSTER_NODE2_IP:-$(ktc_int2ip $((ktc_link_net + 6)))}
KTC_PEER_VETH1=${KNOTLESS_CLUSTER_PEER_VETH1:-ktc-peer1}
KTC_PEER_VETH2=${KNOTLESS_CLUSTER_PEER_VETH2:-ktc-peer2}
KTC_PEER_CIDR=${KNOTLESS_CLUSTER_PEER_CIDR:-$(ktc_int2ip $((ktc_link_net + 8)))/30}
KTC_PEER_IP1=${KNOTLESS_CLUSTER_PEER_IP1:-$(ktc_int2ip $((ktc_link_net + 9)))}
KTC_PEER_IP2=${KNOTLESS_CLUSTER_PEER_IP2:-$(ktc_int2ip $((ktc_link_net + 10)))}

# Ports. Control plane ports are bound on the host (loopback, or HOST_IP
# for the API server); the kubelet's are bound in the node's namespace.
KTC_APISERVER_PORT=${KNOTLESS_CLUSTER_APISERVER_PORT:-26443}
KTC_ETCD_PORT=${KNOTLESS_CLUSTER_ETCD_PORT:-22379}
KTC_ETCD_PEER_PORT=${KNOTLESS_CLUSTER_ETCD_PEER_PORT:-22380}
KTC_CONTROLLER_MANAGER_PORT=${KNOTLESS_CLUSTER_CONTROLLER_MANAGER_PORT:-20257}
KTC_SCHEDULER_PORT=${KNOTLESS_CLUSTER_SCHEDULER_PORT:-20259}
KTC_KUBELET_PORT=${KNOTLESS_CLUSTER_KUBELET_PORT:-20250}
KTC_KUBELET_HEALTHZ_PORT=${KNOTLESS_CLUSTER_KUBELET_HEALTHZ_PORT:-20248}
KTC_KUBE_ROUTER_HEALTH_PORT=${KNOTLESS_CLUSTER_KUBE_ROUTER_HEALTH_PORT:-20244}

# Images, built from Debian's busybox-static and imported into the node's
# containerd. Nothing is pulled from a registry.
KTC_IMAGE=${KNOTLESS_CLUSTER_IMAGE:-knotless.test/busybox:1}
KTC_PAUSE_IMAGE=${KNOTLESS_CLUSTER_PAUSE_IMAGE:-knotless.test/pause:1}

KTC_KUBE_VERSION=v1.34.4

# Paths inside the run directory.
KTC_PKI=$KTC_DIR/pki
KTC_LOGS=$KTC_DIR/logs
KTC_PIDS=$KTC_DIR/pids
KTC_STATE=$KTC_DIR/state
KTC_CONTAINERD_SOCK=$KTC_DIR/containerd/containerd.sock
KTC_ADMIN_KUBECONFIG=$KTC_DIR/admin.kubeconfig

# The sysctls that the node changes on the host (the kubelet sets the
# first three; the net.* ones live in the node's namespace and go with it).
KTC_HOST_SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory)

# Host paths outside the run directory that the node's components create
# whatever they are told; down removes each one that up found absent.
KTC_HOST_PATHS=(
	/var/lib/kubelet/device-plugins/kubelet.sock
	/var/lib/kubelet/device-plugins
	/var/lib/kubelet
	/var/log/containers
	/run/containerd/s
	/run/containerd
	/var/lib/cni/results
	/var/lib/cni
	/run/netns
)

# The components, in start order. Each runs from the cached binaries with
# its PID in $KTC_PIDS/NAME.pid and its log in $KTC_LOGS/NAME.log.
KTC_COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-router)

ktc_log() { printf '%s [%s] %s\n' "$(date +%H:%M:%S)" "${KTC_SCRIPT:-cluster}" "$*" >&2; }
ktc_die() {
	ktc_log "error: $*"
	exit 1
}

# ktc_now prints seconds since the epoch with milliseconds.
ktc_now() { date +%s.%3N; }

# ktc_phase NAME START prints how long the phase NAME took since START.
ktc_phase() { ktc_log "$(printf 'phase %-22s %6.2fs' "$1" "$(echo "$(ktc_now) - $2" | bc)")"; }

# ktc_in_node runs a command in the node's network namespace (and nothing
# else: the mount namespace stays the host's, so kubelet's volume mounts
# are seen by containerd).
ktc_in_node() { nsenter --net="/run/netns/$KTC_NETNS" -- "$@"; }

# ktc_hash prints a short hash of the harness sources that decide what the
# binaries are, plus the Go version that builds them.
ktc_hash() {
	(
		cd "$KTC_SRC" || exit
		go version
		echo "$KTC_KUBE_VERSION"
		cat go.mod go.sum kube-router/go.mod kube-router/go.sum
		find cmd -type f -name '*.go' | LC_ALL=C sort | xargs cat
		sed -n '/^# BUILD-BEGIN/,/^# BUILD-END/p' "$KTC_SRC/lib.sh"
	) | sha256sum | cut -c1-16
}

# ktc_cached says whether ktc_build will find the binaries cached (the
# same test as its own, outside the cache key's block).
ktc_cached() {
	local out
	out=$KTC_CACHE/bin-$(ktc_hash)
	[[ -x $out/kube && -x $out/kube-router && -x $out/pause && -x $out/mkimage ]]
}

# ktc_build_packages prints how many packages the binaries need (go list
# -deps of what ktc_build builds, the standard library's included).
ktc_build_packages() {
	{
		(cd "$KTC_SRC" && CGO_ENABLED=0 go list -deps ./cmd/kube ./cmd/pause ./cmd/mkimage)
		(cd "$KTC_SRC/kube-router" && CGO_ENABLED=0 go list -deps github.com/cloudnativelabs/kube-router/v2/cmd/kube-router)
	} 2>/dev/null | sort -u | wc -l
}

# ktc_progress TOTAL reads `go build -v` on stdin (one package path a line,
# as each is compiled), passes any other line to stderr, and logs every
# KTC_PROGRESS_EVERY seconds (30) how many of TOTAL packages are compiled
# and how long it has been; at the end, the count and the time.
ktc_progress() {
	local total=$1 n=0 start=$SECONDS last=$SECONDS line rc every=${KTC_PROGRESS_EVERY:-30}
	while :; do
		if IFS= read -r -t 1 line; then
			if [[ $line =~ ^[A-Za-z0-9._~/+-]+$ ]]; then n=$((n + 1)); else printf '%s\n' "$line" >&2; fi
		else
			rc=$?
			((rc > 128)) || break # EOF; above 128: the second passed
		fi
		if ((SECONDS - last >= every)); then
			last=$SECONDS
			ktc_log "building: $n of $total packages compiled ($((n * 100 / (total > 0 ? total : 1)))%), $(ktc_minutes $((SECONDS - start))) so far"
		fi
	done
	ktc_log "go build ended: $n packages compiled in $(ktc_minutes $((SECONDS - start)))"
}

ktc_minutes() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# ktc_build_progress runs ktc_build where nothing is cached yet: it says
# first what is built and how long that takes, then how far it is.
ktc_build_progress() {
	local total
	if ktc_cached; then
		ktc_build
		return
	fi
	total=$(ktc_build_packages)
	ktc_log "first build on this machine: Kubernetes $KTC_KUBE_VERSION and kube-router from source, $total packages;" \
		"15-25 min on 2 cores with an empty Go build cache (measured 18 min), a few with a warm one; progress every ${KTC_PROGRESS_EVERY:-30} s"
	GOFLAGS="${GOFLAGS:+$GOFLAGS }-v" ktc_build 2> >(ktc_progress "$total")
	wait $! # the last progress line
}

# BUILD-BEGIN (this block is part of the cache key)
# ktc_build builds (or finds cached) the binaries and sets KTC_BIN to the
# directory that holds them: kube and its component symlinks, kube-router,
# pause, mkimage.
ktc_build() {
	local hash out tmp ldflags pkg=k8s.io/component-base/version
	hash=$(ktc_hash)
	out=$KTC_CACHE/bin-$hash
	KTC_BIN=$out
	if [[ -x $out/kube && -x $out/kube-router && -x $out/pause && -x $out/mkimage ]]; then
		ktc_log "binaries cached in $out"
		return 0
	fi
	mkdir -p "$KTC_CACHE"
	tmp=$(mktemp -d "$KTC_CACHE/build.XXXXXX")
	ldflags="-s -w -X $pkg.gitVersion=$KTC_KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=34"
	ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
	ktc_log "building Kubernetes $KTC_KUBE_VERSION components into $out"
	(
		cd "$KTC_SRC" || exit
		export CGO_ENABLED=0
		go build -trimpath -ldflags "$ldflags" -o "$tmp/kube" ./cmd/kube
		go build -trimpath -ldflags "-s -w" -o "$tmp/pause" ./cmd/pause
		go build -trimpath -ldflags "-s -w" -o "$tmp/mkimage" ./cmd/mkimage
		cd kube-router
		go build -trimpath -ldflags "-s -w" -o "$tmp/kube-router" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
	) || {
		rm -rf "$tmp"
		ktc_die "build failed"
	}
	local c
	for c in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
		ln -s kube "$tmp/$c"
	done
	rm -rf "$out"
	mv "$tmp" "$out"
	# Keep the cache small: binaries of other source hashes are stale.
	find "$KTC_CACHE" -mindepth 1 -maxdepth 1 -name 'bin-*' ! -name "bin-$hash" -exec rm -rf {} +
}
# BUILD-END

# ---------------------------------------------------------------------------
# Packages

KTC_PACKAGES=(etcd-server containerd runc containernetworking-plugins busybox-static
	ipset iptables conntrack openssl nftables iproute2 util-linux procps curl jq bc)

ktc_packages() {
	local missing=() p
	for p in "${KTC_PACKAGES[@]}"; do
		[[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] || missing+=("$p")
	done
	((${#missing[@]} == 0)) && return 0
	ktc_log "installing ${missing[*]}"
	# policy-rc.d keeps the system's containerd.service from being started
	# by the package; ours runs with its own socket, root and state anyway.
	local had_policy=1
	if [[ ! -e /usr/sbin/policy-rc.d ]]; then
		had_policy=0
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod +x /usr/sbin/policy-rc.d
	fi
	local rc=0
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >&2 || rc=$?
	((had_policy)) || rm -f /usr/sbin/policy-rc.d
	((rc == 0)) || ktc_die "apt-get install ${missing[*]} failed"
}

# ---------------------------------------------------------------------------
# Processes

# ktc_is_ours PID succeeds when PID is a process of this cluster: its
# command line names the run directory (every component gets flags under
# it, and the containerd shims get our containerd's socket).
ktc_is_ours() {
	local args
	mapfile -d '' args 2>/dev/null <"/proc/$1/cmdline" || return 1
	[[ "${args[*]}" == *"$KTC_DIR/"* ]]
}

# ktc_start NAME CMD... starts a component detached, in its own session,
# with its log and PID file in the run directory.
ktc_start() {
	local name=$1
	shift
	setsid "$@" >>"$KTC_LOGS/$name.log" 2>&1 </dev/null &
	echo $! >"$KTC_PIDS/$name.pid"
}

# ktc_our_pids prints every PID that belongs to this cluster: the PID
# files (command line checked: PIDs are reused), every process of one of
# the cluster's binaries whose command line names the run directory
# (components and containerd shims, also after kill -9 of their parent),
# every process in the node's network namespace and every process in the
# cluster's cgroups (the containers).
ktc_our_pids() {
	local f pid exe
	for f in "$KTC_PIDS"/*.pid; do
		[[ -f $f ]] || continue
		pid=$(<"$f")
		[[ $pid =~ ^[0-9]+$ ]] && ktc_is_ours "$pid" && echo "$pid"
	done
	for pid in $(pgrep -f -- "$KTC_DIR/" || true); do
		exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
		case ${exe##*/} in
		kube | kube-router | kwok | containerd | containerd-shim* | etcd | runc)
			ktc_is_ours "$pid" && echo "$pid"
			;;
		esac
	done
	[[ -e /run/netns/$KTC_NETNS ]] && ip netns pids "$KTC_NETNS" 2>/dev/null
	local h
	for h in /sys/fs/cgroup/*/; do
		[[ -d $h${KTC_CGROUP_ROOT#/} ]] || continue
		find "$h${KTC_CGROUP_ROOT#/}" -name cgroup.procs -exec cat {} + 2>/dev/null
	done
	return 0
}

# ktc_kill_all stops every process of the cluster. The containers and
# the containerd shims get SIGKILL at once (nothing of theirs is kept);
# the components get SIGTERM and, after 2 s, SIGKILL (the API
# server alone can take 15 s to stop gracefully).
ktc_kill_all() {
	local pids comps=() f pid h
	for f in "$KTC_PIDS"/*.pid; do
		[[ -f $f ]] || continue
		pid=$(<"$f")
		[[ $pid =~ ^[0-9]+$ ]] && ktc_is_ours "$pid" && comps+=("$pid")
	done
	((${#comps[@]} == 0)) || kill -TERM "${comps[@]}" 2>/dev/null || true
	mapfile -t pids < <(ktc_our_pids | sort -un)
	for pid in "${pids[@]}"; do
		[[ " ${comps[*]} " == *" $pid "* ]] || kill -KILL "$pid" 2>/dev/null || true
	done
	local deadline=$((SECONDS + 2))
	while ((SECONDS < deadline)); do
		mapfile -t pids < <(ktc_our_pids | sort -un)
		((${#pids[@]} == 0)) && return 0
		sleep 0.1
	done
	local round
	for round in 1 2 3 4 5 6 7 8 9 10; do
		mapfile -t pids < <(ktc_our_pids | sort -un)
		((${#pids[@]} == 0)) && return 0
		kill -KILL "${pids[@]}" 2>/dev/null || true
		sleep 0.3
	done
	mapfile -t pids < <(ktc_our_pids | sort -un)
	((${#pids[@]} == 0)) || ktc_log "warning: processes left: ${pids[*]}"
}

# ---------------------------------------------------------------------------
# Teardown

# ktc_unmount_under DIR unmounts everything mounted at or below DIR,
# deepest first.
ktc_unmount_under() {
	local m
	[[ -d $1 ]] || return 0
	while read -r m; do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || ktc_log "warning: cannot unmount $m"
	done < <(awk -v d="$1" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r)
}

# ktc_delete_netns NAME deletes a network namespace and what lives in it,
# also when its mount is stale.
ktc_delete_netns() {
	[[ -e /run/netns/$1 ]] || return 0
	ip netns delete "$1" 2>/dev/null || {
		umount -l "/run/netns/$1" 2>/dev/null || true
		rm -f "/run/netns/$1"
	}
}

# ktc_teardown removes every trace of the cluster; it is safe to run any
# number of times and after any of the components was killed.
ktc_teardown() {
	ktc_node2_teardown
	ktc_kill_all

	# Mounts under the run directory, deepest first: the pods' volumes,
	# root filesystems, shm and network namespaces (containerd keeps them
	# under its state directory: netns_mounts_under_state_dir).
	ktc_unmount_under "$KTC_DIR"
	# The node's network namespace holds the pod bridge, the veth pair,
	# the pods' routes, kube-router's iptables chains and ipsets, the
	# egress guard and the node's net.* sysctls: all go with it.
	ktc_delete_netns "$KTC_NETNS"
	# (The host's end of the veth pair goes with the node's end: never
	# delete a device by name, it may be another cluster's.)
	local cidr
	for cidr in "$KTC_LINK_CIDR" "$KTC_POD_CIDR" "$KTC_SERVICE_CIDR"; do
		while ip route del unreachable "$cidr" metric "$KTC_ROUTE_METRIC" 2>/dev/null; do :; done
	done

	# Cgroups, deepest first.
	local h
	for h in /sys/fs/cgroup/*/; do
		[[ -d $h${KTC_CGROUP_ROOT#/} ]] || continue
		find "$h${KTC_CGROUP_ROOT#/}" -depth -type d -exec rmdir {} + 2>/dev/null ||
			ktc_log "warning: cannot remove cgroup $h${KTC_CGROUP_ROOT#/}"
	done

	# Host state that the node changed.
	ktc_sysctl_release
	rm -f /var/lib/cni/results/"$KTC_CNI_NETWORK"-*
	if [[ -f $KTC_STATE/created-paths ]]; then
		local p
		while read -r p; do
			case $p in
			/run/containerd | /run/containerd/s)
				# Only when no other containerd may be using it.
				pgrep -x containerd >/dev/null || rm -rf --one-file-system "$p"
				;;
			/var/lib/kubelet/device-plugins/kubelet.sock) rm -f "$p" ;;
			/run/netns)
				# ip netns add made it a mount point; leave it to whoever
				# has a namespace in it now.
				if [[ -d $p && -z $(ls -A "$p") ]]; then
					! mountpoint -q "$p" || umount "$p" 2>/dev/null || umount -l "$p"
					rmdir "$p" 2>/dev/null || true
				fi
				;;
			*) if [[ -d $p ]]; then rmdir "$p" 2>/dev/null || true; fi ;;
			esac
		done <"$KTC_STATE/created-paths"
	fi

	if [[ -d $KTC_DIR ]]; then
		rm -rf --one-file-system "$KTC_DIR" || ktc_log "warning: cannot remove $KTC_DIR"
	fi
}

# ktc_as_node2 points the node settings (KTC_NODE_NAME, KTC_NETNS, KTC_DIR
# and what lives in it, the node IP, pod bridge and prefix, cgroup root,
# CNI network) at the second node, so that the node functions
# (ktc_node_config, ktc_images, ktc_start_kubelet, ktc_start_router,
# ktc_node_ready, ktc_our_pids, ktc_kill_all) act on it. Call it in a
# subshell. The API server's address (KTC_HOST_IP) and the certificates
# (KTC_PKI) stay the cluster's.
ktc_as_node2() {
	KTC_NODE_NAME=$KTC_NODE2_NAME
	KTC_NETNS=$KTC_NODE2_NETNS
	KTC_DIR=$KTC_NODE2_DIR
	KTC_LOGS=$KTC_DIR/logs
	KTC_PIDS=$KTC_DIR/pids
	KTC_STATE=$KTC_DIR/state
	KTC_CONTAINERD_SOCK=$KTC_DIR/containerd/containerd.sock
	KTC_CGROUP_ROOT=$KTC_NODE2_CGROUP_ROOT
	KTC_CNI_NETWORK=$KTC_NODE2_CNI_NETWORK
	KTC_NODE_IP=$KTC_NODE2_IP
	KTC_POD_BRIDGE=$KTC_NODE2_POD_BRIDGE
	KTC_POD_CIDR=$KTC_NODE2_POD_CIDR
}

# ktc_node2_teardown removes every trace of the second node on this
# machine (not its Node object: remove-node deletes that): its processes
# (SIGKILL for all but the components, as ktc_kill_all does), mounts,
# network namespace with its links (also the one to the first node, and
# so the first node's route to its pods), host routes, cgroups, CNI
# results and run directory. Safe to run any number of times.
ktc_node2_teardown() {
	(
		ktc_as_node2
		ktc_kill_all
	)
	ktc_unmount_under "$KTC_NODE2_DIR"
	ktc_delete_netns "$KTC_NODE2_NETNS"
	local cidr
	for cidr in "$KTC_NODE2_LINK_CIDR" $KTC_NODE2_POD_CIDR; do
		while ip route del unreachable "$cidr" metric "$KTC_ROUTE_METRIC" 2>/dev/null; do :; done
	done
	local h
	for h in /sys/fs/cgroup/*/; do
		[[ -d $h${KTC_NODE2_CGROUP_ROOT#/} ]] || continue
		find "$h${KTC_NODE2_CGROUP_ROOT#/}" -depth -type d -exec rmdir {} + 2>/dev/null ||
			ktc_log "warning: cannot remove cgroup $h${KTC_NODE2_CGROUP_ROOT#/}"
	done
	rm -f /var/lib/cni/results/"$KTC_NODE2_CNI_NETWORK"-*
	if [[ -d $KTC_NODE2_DIR ]]; then
		rm -rf --one-file-system "$KTC_NODE2_DIR" || ktc_log "warning: cannot remove $KTC_NODE2_DIR"
	fi
}

# The host sysctls the kubelet sets are machine-wide, and several
# clusters may run at once: the values from before the first of them are
# kept in $KTC_SHARED/sysctl, each running cluster holds them with a file
# in $KTC_SHARED/holders, and the last one to go restores them.
KTC_SHARED=/run/knotless-test-cluster

# ktc_sysctl_hold saves the host sysctls unless a running cluster already
# did, and registers this cluster as a holder.
ktc_sysctl_hold() {
	mkdir -p "$KTC_SHARED/holders"
	(
		flock 9
		if [[ ! -f $KTC_SHARED/sysctl ]]; then
			local key
			for key in "${KTC_HOST_SYSCTLS[@]}"; do
				echo "$key $(sysctl -n "$key")"
			done >"$KTC_SHARED/sysctl.new"
			mv "$KTC_SHARED/sysctl.new" "$KTC_SHARED/sysctl"
		fi
		echo "$KTC_DIR" >"$KTC_SHARED/holders/$KTC_NAME"
	) 9>"$KTC_SHARED/lock"
}

# ktc_sysctl_release drops this cluster's hold; the last holder (holders
# whose run directory is gone do not count) restores the saved sysctls and
# removes $KTC_SHARED. A cluster started before holders existed restores
# its own saved copy.
ktc_sysctl_release() {
	if [[ ! -d $KTC_SHARED ]]; then
		local key val
		if [[ -f $KTC_STATE/sysctl ]]; then
			while read -r key val; do
				sysctl -qw "$key=$val" || ktc_log "warning: cannot restore $key=$val"
			done <"$KTC_STATE/sysctl"
		fi
		return 0
	fi
	(
		flock 9
		rm -f "$KTC_SHARED/holders/$KTC_NAME"
		local h key val
		for h in "$KTC_SHARED"/holders/*; do
			[[ -f $h ]] || continue
			[[ -d $(<"$h") ]] || rm -f "$h"
		done
		if [[ -z $(ls -A "$KTC_SHARED/holders" 2>/dev/null) ]]; then
			if [[ -f $KTC_SHARED/sysctl ]]; then
				while read -r key val; do
					sysctl -qw "$key=$val" || ktc_log "warning: cannot restore $key=$val"
				done <"$KTC_SHARED/sysctl"
			fi
			rm -rf "$KTC_SHARED"
		fi
	) 9>>"$KTC_SHARED/lock"
}

# ktc_leftovers [SYSCTL_FILE] prints one line for everything of the
# cluster that is still on the machine, and for each host sysctl that
# differs from the value saved in SYSCTL_FILE; nothing after a clean
# teardown.
ktc_leftovers() {
	local saved=${1:-$KTC_STATE/sysctl}
	local pids
	pids=$({
		ktc_our_pids
		(
			ktc_as_node2
			ktc_our_pids
		)
	} | sort -un | tr '\n' ' ')
	[[ -z ${pids// /} ]] || echo "processes: $pids"
	awk -v d="$KTC_DIR" '$5 == d || index($5, d "/") == 1 { print "mount: " $5 }' /proc/self/mountinfo
	[[ ! -e $KTC_DIR ]] || echo "path: $KTC_DIR"
	local ns
	for ns in "$KTC_NETNS" "$KTC_NODE2_NETNS"; do
		[[ ! -e /run/netns/$ns ]] || echo "netns: $ns"
		# A link whose other end is in a node's namespace (gone with it).
		ip -o link show 2>/dev/null | grep -F "link-netns $ns " | sed 's/^/link: /' || true
	done
	local cidr
	for cidr in "$KTC_LINK_CIDR" "$KTC_POD_CIDR" "$KTC_SERVICE_CIDR" "$KTC_NODE2_LINK_CIDR" $KTC_NODE2_POD_CIDR; do
		ip route show exact "$cidr" 2>/dev/null | sed 's/^/route: /'
	done
	local h root
	for h in /sys/fs/cgroup/*/; do
		for root in "$KTC_CGROUP_ROOT" "$KTC_NODE2_CGROUP_ROOT"; do
			[[ ! -d $h${root#/} ]] || echo "cgroup: $h${root#/}"
		done
	done
	if command -v iptables-save >/dev/null; then
		local node2_pods=${KTC_NODE2_POD_CIDR%/*}
		iptables-save 2>/dev/null | grep -E -e "$KTC_POD_BRIDGE|$KTC_NODE2_POD_BRIDGE|${KTC_POD_CIDR%/*}|${node2_pods:-${KTC_POD_CIDR%/*}}|${KTC_NAME}" -e '^:KUBE-ROUTER' | sed 's/^/iptables: /' || true
	fi
	if command -v ipset >/dev/null; then
		ipset list -n 2>/dev/null | grep -E '^KUBE-' | sed 's/^/ipset: /' || true
	fi
	find /var/lib/cni/results -maxdepth 1 \( -name "$KTC_CNI_NETWORK-*" -o -name "$KTC_NODE2_CNI_NETWORK-*" \) 2>/dev/null | sed 's/^/cni result: /' || true
	if [[ -f $saved ]]; then
		local key val
		while read -r key val; do
			[[ $(sysctl -n "$key") == "$val" ]] || echo "sysctl: $key=$(sysctl -n "$key") (was $val)"
		done <"$saved"
	fi
	return 0
}

# ---------------------------------------------------------------------------
# Certificates and kubeconfigs

# ktc_cert NAME CN O [SANS] makes $KTC_PKI/NAME.{key,crt}, signed by the CA.
ktc_cert() {
	local name=$1 cn=$2 o=$3 sans=${4:-} subj ext
	subj="/CN=$cn"
	[[ -z $o ]] || subj="/O=$o$subj"
	ext=$KTC_PKI/$name.ext
	{
		echo "basicConstraints=critical,CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		if [[ -n $sans ]]; then
			echo "extendedKeyUsage=serverAuth,clientAuth"
			echo "subjectAltName=$sans"
		else
			echo "extendedKeyUsage=clientAuth"
		fi
	} >"$ext"
	openssl ecparam -name prime256v1 -genkey -noout -out "$KTC_PKI/$name.key" 2>/dev/null
	openssl req -new -key "$KTC_PKI/$name.key" -subj "$subj" -out "$KTC_PKI/$name.csr" 2>/dev/null
	openssl x509 -req -in "$KTC_PKI/$name.csr" -CA "$KTC_PKI/ca.crt" -CAkey "$KTC_PKI/ca.key" \
		-CAcreateserial -days 30 -extfile "$ext" -out "$KTC_PKI/$name.crt" 2>/dev/null
	rm -f "$KTC_PKI/$name.csr" "$ext"
}

# ktc_pki makes the cluster's CA, serving and client certificates and the
# service account signing key.
ktc_pki() {
	mkdir -p "$KTC_PKI"
	chmod 700 "$KTC_PKI"
	openssl ecparam -name prime256v1 -genkey -noout -out "$KTC_PKI/ca.key" 2>/dev/null
	openssl req -x509 -new -key "$KTC_PKI/ca.key" -subj "/CN=$KTC_NAME-ca" -days 30 \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
		-out "$KTC_PKI/ca.crt" 2>/dev/null
	ktc_cert apiserver kube-apiserver "" \
		"IP:$KTC_HOST_IP,IP:127.0.0.1,IP:$KTC_SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	ktc_cert admin "$KTC_NAME-admin" system:masters
	ktc_cert controller-manager system:kube-controller-manager ""
	ktc_cert scheduler system:kube-scheduler ""
	ktc_cert kubelet "system:node:$KTC_NODE_NAME" system:nodes
	ktc_cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
	ktc_cert kube-router "$KTC_NAME-kube-router" system:masters
	openssl ecparam -name prime256v1 -genkey -noout -out "$KTC_PKI/sa.key" 2>/dev/null
	openssl ec -in "$KTC_PKI/sa.key" -pubout -out "$KTC_PKI/sa.pub" 2>/dev/null
}

# ktc_kubeconfig NAME SERVER writes $KTC_DIR/NAME.kubeconfig for the
# client certificate NAME.
ktc_kubeconfig() {
	cat >"$KTC_DIR/$1.kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: $KTC_NAME
  cluster:
    server: $2
    certificate-authority: $KTC_PKI/ca.crt
users:
- name: $1
  user:
    client-certificate: $KTC_PKI/$1.crt
    client-key: $KTC_PKI/$1.key
contexts:
- name: $KTC_NAME
  context:
    cluster: $KTC_NAME
    user: $1
current-context: $KTC_NAME
KUBECONFIG
}

# ktc_api PATH... GETs an API path as the admin; extra args go to curl.
ktc_api() {
	local path=$1
	shift
	curl -sf --max-time 5 --cacert "$KTC_PKI/ca.crt" --cert "$KTC_PKI/admin.crt" --key "$KTC_PKI/admin.key" \
		"$@" "https://$KTC_HOST_IP:$KTC_APISERVER_PORT$path"
}

# ktc_wait WHAT TIMEOUT CMD... polls CMD every 0.2 s until it succeeds.
ktc_wait() {
	local what=$1 timeout=$2 deadline
	shift 2
	deadline=$(($(date +%s) + timeout))
	until "$@" >/dev/null 2>&1; do
		if (($(date +%s) >= deadline)); then
			ktc_log "timed out after ${timeout}s waiting for $what; logs in $KTC_LOGS"
			return 1
		fi
		sleep 0.2
	done
}

# ktc_env prints the shell export lines that describe a running cluster.
ktc_env() {
	cat <<ENV
export KNOTLESS_TEST_KUBECONFIG=$KTC_ADMIN_KUBECONFIG
export KNOTLESS_TEST_IMAGE=$KTC_IMAGE
export KNOTLESS_TEST_PAUSE_IMAGE=$KTC_PAUSE_IMAGE
export KNOTLESS_TEST_NODE_NAME=$KTC_NODE_NAME
export KNOTLESS_TEST_NODE_NETNS=$KTC_NETNS
export KNOTLESS_TEST_NODE_IP=$KTC_NODE_IP
export KNOTLESS_TEST_HOST_IP=$KTC_HOST_IP
export KNOTLESS_TEST_POD_CIDR=$KTC_POD_CIDR
export KNOTLESS_TEST_POD_BRIDGE=$KTC_POD_BRIDGE
export KNOTLESS_TEST_CONTAINERD_SOCK=$KTC_CONTAINERD_SOCK
export KNOTLESS_TEST_CLUSTER_DIR=$KTC_DIR
export KNOTLESS_TEST_CLUSTER_SCRIPTS=$KTC_SRC
ENV
	# The second node, once add-node has made it.
	[[ -f $KTC_NODE2_DIR/added ]] || return 0
	cat <<ENV
export KNOTLESS_TEST_NODE2_NAME=$KTC_NODE2_NAME
export KNOTLESS_TEST_NODE2_NETNS=$KTC_NODE2_NETNS
export KNOTLESS_TEST_NODE2_IP=$KTC_NODE2_IP
export KNOTLESS_TEST_NODE2_POD_CIDR=$KTC_NODE2_POD_CIDR
export KNOTLESS_TEST_NODE2_CONTAINERD_SOCK=$KTC_NODE2_DIR/containerd/containerd.sock
ENV
}

# ---------------------------------------------------------------------------
# Components

# ktc_start_apiserver starts kube-apiserver (up, restart-apiserver).
ktc_start_apiserver() {
	ktc_start kube-apiserver "$KTC_BIN/kube-apiserver" \
		--etcd-servers "http://127.0.0.1:$KTC_ETCD_PORT" \
		--bind-address "$KTC_HOST_IP" --advertise-address "$KTC_HOST_IP" --secure-port "$KTC_APISERVER_PORT" \
		--tls-cert-file "$KTC_PKI/apiserver.crt" --tls-private-key-file "$KTC_PKI/apiserver.key" \
		--client-ca-file "$KTC_PKI/ca.crt" \
		--kubelet-client-certificate "$KTC_PKI/apiserver-kubelet-client.crt" \
		--kubelet-client-key "$KTC_PKI/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types InternalIP \
		--service-account-issuer "https://kubernetes.default.svc" \
		--service-account-key-file "$KTC_PKI/sa.pub" \
		--service-account-signing-key-file "$KTC_PKI/sa.key" \
		--service-cluster-ip-range "$KTC_SERVICE_CIDR" \
		--authorization-mode Node,RBAC \
		--enable-admission-plugins NodeRestriction,PodNodeSelector \
		--allow-privileged \
		--profiling=false --cert-dir "$KTC_DIR/apiserver" --v 1
}

# ktc_start_controllers starts kube-controller-manager and kube-scheduler
# (up, restart-apiserver).
ktc_start_controllers() {
	local mask=${KTC_POD_CIDR#*/}
	# --cluster-cidr: room for the optional second node (see KTC_CLUSTER_CIDR).
	ktc_start kube-controller-manager "$KTC_BIN/kube-controller-manager" \
		--kubeconfig "$KTC_DIR/controller-manager.kubeconfig" \
		--authentication-kubeconfig "$KTC_DIR/controller-manager.kubeconfig" \
		--authorization-kubeconfig "$KTC_DIR/controller-manager.kubeconfig" \
		--bind-address 127.0.0.1 --secure-port "$KTC_CONTROLLER_MANAGER_PORT" \
		--leader-elect=false --use-service-account-credentials \
		--service-account-private-key-file "$KTC_PKI/sa.key" --root-ca-file "$KTC_PKI/ca.crt" \
		--cluster-signing-cert-file "$KTC_PKI/ca.crt" --cluster-signing-key-file "$KTC_PKI/ca.key" \
		--allocate-node-cidrs --cluster-cidr "$KTC_CLUSTER_CIDR" --node-cidr-mask-size "$mask" \
		--service-cluster-ip-range "$KTC_SERVICE_CIDR" \
		--concurrent-job-syncs 10 --node-monitor-grace-period 20s \
		--cert-dir "$KTC_DIR/controller-manager" --v 1
	ktc_start kube-scheduler "$KTC_BIN/kube-scheduler" \
		--kubeconfig "$KTC_DIR/scheduler.kubeconfig" \
		--authentication-kubeconfig "$KTC_DIR/scheduler.kubeconfig" \
		--authorization-kubeconfig "$KTC_DIR/scheduler.kubeconfig" \
		--bind-address 127.0.0.1 --secure-port "$KTC_SCHEDULER_PORT" \
		--leader-elect=false --cert-dir "$KTC_DIR/scheduler" --v 1
}

# ktc_start_kubelet starts the node's kubelet (up, restart-apiserver).
ktc_start_kubelet() {
	ktc_start kubelet nsenter --net="/run/netns/$KTC_NETNS" -- "$KTC_BIN/kubelet" \
		--config "$KTC_DIR/kubelet/config.yaml" --kubeconfig "$KTC_DIR/kubelet.kubeconfig" \
		--root-dir "$KTC_DIR/kubelet" --cert-dir "$KTC_DIR/kubelet/pki" \
		--hostname-override "$KTC_NODE_NAME" --node-ip "$KTC_NODE_IP" --v 1
}

# ktc_start_router starts kube-router, the NetworkPolicy firewall (up,
# restart-apiserver).
ktc_start_router() {
	ktc_start kube-router nsenter --net="/run/netns/$KTC_NETNS" -- "$KTC_BIN/kube-router" \
		--kubeconfig "$KTC_DIR/kube-router.kubeconfig" --hostname-override "$KTC_NODE_NAME" \
		--run-router=false --run-service-proxy=false --run-firewall=true --enable-cni=false \
		--enable-ipv4=true --enable-ipv6=false \
		--health-port "$KTC_KUBE_ROUTER_HEALTH_PORT" --metrics-port 0 --v 1
}

# ktc_router_ready: kube-router has installed its FORWARD chain.
ktc_router_ready() { ip netns exec "$KTC_NETNS" iptables -w -S FORWARD | grep -q KUBE-ROUTER-FORWARD; }

# ktc_node_ready: the node reports Ready.
ktc_node_ready() {
	[[ $(ktc_api "/api/v1/nodes/$KTC_NODE_NAME" |
		jq -r '.status.conditions[] | select(.type == "Ready") | .status') == True ]]
}

# ktc_node_config writes the configuration of containerd, the CNI network
# and the kubelet.
ktc_node_config() {
	local cd=$KTC_DIR/containerd
	mkdir -p "$cd" "$cd/certs.d" "$KTC_DIR/cni/net.d" "$KTC_DIR/kubelet"
	cat >"$cd/config.toml" <<TOML
version = 2
root = "$cd/root"
state = "$cd/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "$KTC_CONTAINERD_SOCK"

[ttrpc]
  address = "$KTC_CONTAINERD_SOCK.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$KTC_PAUSE_IMAGE"
  # Root here lacks CAP_SYS_RESOURCE: without this every sandbox fails
  # with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  max_container_log_line_size = 16384
  # Pod network namespaces under our state directory, not /run/netns.
  netns_mounts_under_state_dir = true

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "$cd/runc"

[plugins."io.containerd.grpc.v1.cri".registry]
  # A registry's hosts.toml is read from here at each pull, so a test
  # harness can add a registry to the running node (tests/registry).
  config_path = "$cd/certs.d"

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "$KTC_DIR/cni/net.d"
  max_conf_num = 1
TOML
	cat >"$KTC_DIR/cni/net.d/10-$KTC_NAME.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "$KTC_CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$KTC_POD_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$KTC_POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$KTC_DIR/cni/networks"
      }
    }
  ]
}
JSON
	cat >"$KTC_DIR/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $KTC_NODE_IP
port: $KTC_KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KTC_KUBELET_HEALTHZ_PORT
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $KTC_PKI/ca.crt
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
cgroupRoot: $KTC_CGROUP_ROOT
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://$KTC_CONTAINERD_SOCK
failSwapOn: false
resolvConf: ""
podLogsDir: $KTC_DIR/pod-logs
volumePluginDir: $KTC_DIR/kubelet/volume-plugins
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
serializeImagePulls: false
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
fileCheckFrequency: 20s
protectKernelDefaults: false
maxPods: 110
YAML
}

# ktc_images builds the run and sandbox images from the host's busybox and
# our pause binary and imports them into the node's containerd.
ktc_images() {
	local img=$KTC_DIR/images
	mkdir -p "$img"
	"$KTC_BIN/mkimage" -name "$KTC_IMAGE" -out "$img/run.tar" \
		-add /bin/busybox=/bin/busybox -busybox /bin/busybox -cmd sh
	"$KTC_BIN/mkimage" -name "$KTC_PAUSE_IMAGE" -out "$img/pause.tar" \
		-add "$KTC_BIN/pause=/pause" -entrypoint /pause
	local t
	for t in run pause; do
		ctr --address "$KTC_CONTAINERD_SOCK" --timeout 60s -n k8s.io images import "$img/$t.tar" >/dev/null ||
			ktc_die "import $t image"
	done
	local have
	have=$(ctr --address "$KTC_CONTAINERD_SOCK" -n k8s.io images ls -q)
	grep -qxF "$KTC_IMAGE" <<<"$have" || ktc_die "image $KTC_IMAGE not imported"
	grep -qxF "$KTC_PAUSE_IMAGE" <<<"$have" || ktc_die "image $KTC_PAUSE_IMAGE not imported"
}

# ktc_load_config re-reads the KNOTLESS_CLUSTER_* settings that up ran
# with, so env, down and restart-apiserver need only the run directory
# (or nothing, for the default cluster).
ktc_load_config() {
	if [[ -f $KTC_DIR/cluster.env ]]; then
		# shellcheck disable=SC1091
		source "$KTC_DIR/cluster.env"
		# shellcheck source=lib.sh
		source "$KTC_SRC/lib.sh"
	fi
}

# ---------------------------------------------------------------------------
# The capacity rig (kwok-up, kwok-down): fake nodes that kwok's controller
# keeps alive (leases, status) and on whose pods it acts only to delete
# them: a pod bound to a fake node stays Pending, never runs a container.

KTC_KWOK_VERSION=v0.8.0
KTC_KWOK_DIR=$KTC_DIR/kwok
# Every fake node carries the label, the annotation kwok's controller
# selects by, and the taint that keeps every pod without the toleration
# (every other test's) off it.
KTC_KWOK_LABEL=knotless.test/kwok
KTC_KWOK_ANNOTATION=kwok.x-k8s.io/node
KTC_KWOK_TAINT=kwok.x-k8s.io/node
# The fake nodes' address: on loopback, where nothing listens for them.
KTC_KWOK_NODE_IP=${KNOTLESS_CLUSTER_KWOK_NODE_IP:-127.0.0.2}

# ktc_kwok_build builds (or finds cached) kwok's controller, as its own
# module from the Go module proxy (it needs other k8s.io versions than
# the runner's or the cluster's), and sets KTC_KWOK to it.
ktc_kwok_build() {
	local out=$KTC_CACHE/kwok-$KTC_KWOK_VERSION-$(go env GOVERSION) tmp
	KTC_KWOK=$out/kwok
	[[ -x $KTC_KWOK ]] && return 0
	mkdir -p "$KTC_CACHE"
	tmp=$(mktemp -d "$KTC_CACHE/kwok-build.XXXXXX")
	ktc_log "building kwok $KTC_KWOK_VERSION into $out (a few minutes on 2 cores with an empty Go build cache)"
	(cd "$tmp" && CGO_ENABLED=0 GOFLAGS=-mod=mod GOBIN="$tmp/bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KTC_KWOK_VERSION") || {
		rm -rf "$tmp"
		ktc_die "build kwok $KTC_KWOK_VERSION failed"
	}
	rm -rf "$out"
	mkdir -p "$out"
	mv "$tmp/bin/kwok" "$KTC_KWOK"
	rm -rf "$tmp"
	find "$KTC_CACHE" -mindepth 1 -maxdepth 1 -name 'kwok-v*' ! -path "$out" -exec rm -rf {} +
}

# ktc_kwok_nodes prints the names of the fake nodes.
ktc_kwok_nodes() {
	ktc_api "/api/v1/nodes?labelSelector=$KTC_KWOK_LABEL%3Dtrue" | jq -r '.items[].metadata.name'
}

# ktc_kwok_teardown removes every fake node and the pods bound to them,
# and stops kwok's controller; safe to run any number of times.
ktc_kwok_teardown() {
	local nodes pods
	mapfile -t nodes < <(ktc_kwok_nodes 2>/dev/null || true)
	if ((${#nodes[@]} > 0)); then
		# Pods on a fake node never ran a container: nothing of theirs
		# needs a grace period.
		mapfile -t pods < <(ktc_api "/api/v1/pods?fieldSelector=status.phase%21%3DSucceeded" |
			jq -r --arg p "$KTC_NAME-kwok-" '.items[] | select((.spec.nodeName // "") | startswith($p)) | "\(.metadata.namespace)/\(.metadata.name)"')
		local p
		for p in "${pods[@]}"; do
			ktc_api "/api/v1/namespaces/${p%%/*}/pods/${p#*/}" -X DELETE -H 'Content-Type: application/json' \
				-d '{"gracePeriodSeconds":0}' >/dev/null || true
		done
		ktc_api "/api/v1/nodes?labelSelector=$KTC_KWOK_LABEL%3Dtrue" -X DELETE >/dev/null || true
	fi
	local f=$KTC_PIDS/kwok.pid pid
	if [[ -f $f ]]; then
		pid=$(<"$f")
		if [[ $pid =~ ^[0-9]+$ ]] && ktc_is_ours "$pid"; then
			kill -TERM "$pid" 2>/dev/null || true
			local i
			for i in $(seq 50); do
				kill -0 "$pid" 2>/dev/null || break
				sleep 0.1
			done
			kill -KILL "$pid" 2>/dev/null || true
		fi
		rm -f "$f"
	fi
	ktc_kwok_none() { [[ -z $(ktc_kwok_nodes) ]]; }
	ktc_wait "the fake nodes to go" 60 ktc_kwok_none || return 1
	rm -f "$KTC_KWOK_DIR/up"
}
