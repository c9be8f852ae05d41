# Network namespaces as hosts on one machine: helpers sourced by netns_e2e.sh and
# bench/netns_bench.sh (docs/multi-host.md).
#
# Topology: one "switch" namespace holding a bridge, and one namespace per host, each joined to
# the bridge by a veth pair. Host i has the address 10.77.0.(10+i)/24 on its eth0. Every link
# gets a tbf rate limit in both directions (on the host's eth0 for what it sends, on the
# switch port for what it receives). Names carry a per-run tag, so parallel runs do not collide
# and cleanup removes only what this run made.
#
#   netns_require                 exits 77 (ctest's skip) with one line when namespaces, veth
#                                 pairs, bridges or tbf cannot be made here
#   netns_switch                  makes the switch namespace and its bridge
#   netns_host NAME INDEX RATE    makes host NAME (namespace $NETNS_TAG-NAME) with address
#                                 10.77.0.(10+INDEX); RATE is a tbf rate ("1gbit", "10gbit") or
#                                 "none"
#   netns_exec NAME CMD...        runs CMD in host NAME
#   netns_spawn NAME LOG CMD...   starts CMD in host NAME in the background, stdout and stderr
#                                 to LOG; sets netns_pid to its pid (the program's own: `ip
#                                 netns exec` execs it), so kill and wait reach the program
#   netns_addr NAME               prints host NAME's address
#   netns_rate NAME RATE          replaces the tbf of host NAME's link (both directions)
#   netns_link NAME up|down       sets host NAME's switch port up or down (the host's cable)
#   netns_cleanup                 kills what runs in this run's namespaces and deletes them
#                                 (their veth pairs and qdiscs go with them)
#
# Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2 (ip, tc).

NETNS_TAG="${NETNS_TAG:-aps$$}"
NETNS_SW="$NETNS_TAG-sw"
netns_names=()     # namespaces made by this run, deleted by netns_cleanup
declare -A netns_index=()

netns_skip() {
  echo "SKIP: $* (network namespace tests need root with CAP_NET_ADMIN and iproute2)"
  exit 77
}

# Checks what the helpers need, making and deleting a probe namespace with a veth pair, a
# bridge and a tbf qdisc. Exits 77 with one line saying what is missing.
netns_require() {
  [[ "$(id -u)" -eq 0 ]] || netns_skip "not root"
  command -v ip >/dev/null 2>&1 || netns_skip "'ip' not found (Debian: apt-get install iproute2)"
  command -v tc >/dev/null 2>&1 || netns_skip "'tc' not found (Debian: apt-get install iproute2)"
  local probe="$NETNS_TAG-probe" why=""
  if ! why="$(ip netns add "$probe" 2>&1)"; then
    netns_skip "cannot create a network namespace: ${why:-ip netns add failed}"
  fi
  if ! why="$(ip -n "$probe" link add p0 type veth peer name p1 2>&1)"; then
    ip netns del "$probe" 2>/dev/null || true
    netns_skip "cannot create a veth pair: $why"
  fi
  if ! why="$(ip -n "$probe" link add pbr type bridge 2>&1)"; then
    ip netns del "$probe" 2>/dev/null || true
    netns_skip "cannot create a bridge: $why"
  fi
  ip -n "$probe" link set p0 up 2>/dev/null || true
  if ! why="$(ip netns exec "$probe" tc qdisc add dev p0 root tbf rate 1gbit burst 256kb \
              latency 10ms 2>&1)"; then
    ip netns del "$probe" 2>/dev/null || true
    netns_skip "cannot add a tbf qdisc: $why"
  fi
  ip netns del "$probe"
}

netns_switch() {
  ip netns add "$NETNS_SW"
  netns_names+=("$NETNS_SW")
  ip -n "$NETNS_SW" link set lo up
  ip -n "$NETNS_SW" link add br0 type bridge
  ip -n "$NETNS_SW" link set br0 up
}

# tbf on DEV in namespace NS at RATE. The bucket holds about 1 ms of traffic at the rate (at
# least 64 KiB: a TSO segment), and up to 20 ms may queue behind it before packets drop.
netns_tbf() {
  local ns="$1" dev="$2" rate="$3"
  [[ "$rate" == none ]] && return 0
  local bits
  case "$rate" in
    *gbit) bits=$(( ${rate%gbit} * 1000000000 )) ;;
    *mbit) bits=$(( ${rate%mbit} * 1000000 )) ;;
    *) echo "netns_tbf: rate '$rate' is not Ngbit or Nmbit" >&2; return 1 ;;
  esac
  local burst=$(( bits / 8 / 1000 ))
  (( burst >= 65536 )) || burst=65536
  ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 20ms
}

netns_host() {
  local name="$1" index="$2" rate="$3"
  local ns="$NETNS_TAG-$name" port="$NETNS_TAG$name"
  (( ${#port} <= 15 )) || { echo "netns_host: interface name '$port' too long" >&2; return 1; }
  ip netns add "$ns"
  netns_names+=("$ns")
  netns_index[$name]=$index
  ip -n "$ns" link set lo up
  # The veth pair is made in the host namespace and one end moved to the switch.
  ip -n "$ns" link add eth0 type veth peer name "$port"
  ip -n "$ns" link set "$port" netns "$NETNS_SW"
  ip -n "$NETNS_SW" link set "$port" master br0
  ip -n "$NETNS_SW" link set "$port" up
  ip -n "$ns" addr add "$(netns_addr "$name")/24" dev eth0
  ip -n "$ns" link set eth0 up
  netns_tbf "$ns" eth0 "$rate"
  netns_tbf "$NETNS_SW" "$port" "$rate"
}

netns_addr() { echo "10.77.0.$((10 + ${netns_index[$1]}))"; }

netns_exec() {
  local name="$1"
  shift
  ip netns exec "$NETNS_TAG-$name" "$@"
}

netns_rate() {
  local ns="$NETNS_TAG-$1" port="$NETNS_TAG$1"
  ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
  ip netns exec "$NETNS_SW" tc qdisc del dev "$port" root 2>/dev/null || true
  netns_tbf "$ns" eth0 "$2"
  netns_tbf "$NETNS_SW" "$port" "$2"
}

netns_spawn() {
  local name="$1" log="$2"
  shift 2
  ip netns exec "$NETNS_TAG-$name" "$@" >"$log" 2>&1 &
  netns_pid=$!
}

netns_link() { ip -n "$NETNS_SW" link set "$NETNS_TAG$1" "$2"; }

# Kills every process left in this run's namespaces (all of them were started by this run),
# then deletes the namespaces, which removes their veth pairs, the bridge and the qdiscs.
netns_cleanup() {
  local ns pid
  for ns in "${netns_names[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
  done
  for ns in "${netns_names[@]}"; do
    ip netns del "$ns" 2>/dev/null || true
  done
  netns_names=()
  if ip netns list 2>/dev/null | grep -q "^$NETNS_TAG-"; then
    echo "netns: namespaces left behind: $(ip netns list | grep "^$NETNS_TAG-" | tr '\n' ' ')" >&2
  fi
}
