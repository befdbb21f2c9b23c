#!/bin/bash
# The two-host DiComm test: two network namespaces joined by a veth pair, each with its own /dev/shm (its own
# IPC and mount namespace), two ranks in each. The four ranks run every collective with exact values
# (comm_worker collectives), hierarchical across the two "hosts", so shared memory carries traffic within a
# namespace and TCP over the veth pair carries it across. Then again without claiming hosts: the ranks must find
# for themselves that they cannot map each other's shared windows across the namespaces, and all-reduce by
# messages (halving-doubling), still exactly. Where namespaces cannot be made (not root, no
# iproute2, a container without CAP_SYS_ADMIN), it exits 77, which CTest reports as skipped, with the reason.
# usage: two_hosts.sh PATH/TO/comm_worker
set -u
worker=$1
skip() {
  echo "SKIPPED: $* - the two-host test did not run"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "creating network namespaces needs root"
command -v ip > /dev/null || skip "ip (Debian package iproute2) is not installed"
command -v unshare > /dev/null || skip "unshare (util-linux) is not installed"

id=$$
a=h2a$id b=h2b$id
logs=$(mktemp -d)
cleanup() {
  ip netns del "$a" 2> /dev/null
  ip netns del "$b" 2> /dev/null
  rm -rf "$logs"
}
trap cleanup EXIT
ip netns add "$a" 2> "$logs/err" || skip "cannot create a network namespace: $(cat "$logs/err")"
ip netns add "$b" 2> "$logs/err" || skip "cannot create a network namespace: $(cat "$logs/err")"
ip link add "va$id" type veth peer name "vb$id" 2> "$logs/err" || skip "cannot create a veth pair: $(cat "$logs/err")"
ip link set "va$id" netns "$a" && ip link set "vb$id" netns "$b" &&
  ip -n "$a" addr add 10.213.0.1/24 dev "va$id" && ip -n "$b" addr add 10.213.0.2/24 dev "vb$id" &&
  ip -n "$a" link set "va$id" up && ip -n "$b" link set "vb$id" up &&
  ip -n "$a" link set lo up && ip -n "$b" link set lo up || skip "cannot configure the veth pair"
unshare --ipc --mount true 2> "$logs/err" || skip "cannot make IPC and mount namespaces: $(cat "$logs/err")"

# Runs ranks $2 and $2+1 in namespace $1 with their own /dev/shm, on port $3, claiming host $1 unless $4 is
# "unclaimed"; writes each rank's output and exit code.
host() {
  local claim="H2_HOST_ID=$1"
  [ "$4" = unclaimed ] && claim=""
  ip netns exec "$1" unshare --ipc --mount bash -c '
    mount -t tmpfs tmpfs /dev/shm || exit 1
    for r in '"$2"' $(('"$2"' + 1)); do
      (env '"$claim"' H2_RANK=$r H2_WORLD_SIZE=4 H2_MASTER_ADDR=10.213.0.1 H2_MASTER_PORT='"$3"' \
        H2_JOB_TOKEN=two-hosts H2_COMM_TIMEOUT_MS=${H2_COMM_TIMEOUT_MS:-30000} \
        timeout 120 '"$worker"' collectives > '"$logs"'/rank$r.log 2>&1
       echo $? > '"$logs"'/rank$r.rc) &
    done
    wait'
}

failed=0
port=$((29600 + id % 300))
for run in claimed unclaimed; do
  expect="hierarchical"
  [ $run = unclaimed ] && expect="halving-doubling"
  rm -f "$logs"/rank*
  host "$a" 0 $port $run &
  host "$b" 2 $port $run &
  wait
  port=$((port + 300))
  echo "hosts $run (expected: $expect):"
  for r in 0 1 2 3; do
    rc=$(cat "$logs/rank$r.rc" 2> /dev/null || echo missing)
    echo "rank $r (exit $rc): $(cat "$logs/rank$r.log" 2> /dev/null)"
    [ "$rc" = 0 ] || failed=1
    grep -q "large all-reduce: $expect" "$logs/rank$r.log" 2> /dev/null || failed=1
  done
done
[ $failed = 0 ] && echo "PASSED: all-reduce correct across two network namespaces"
exit $failed
