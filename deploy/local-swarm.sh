#!/bin/sh
# Glue for compose.local.yaml: lets the training nodes find the bootstrap peer on the compose
# network. The bootstrap publishes its peer id in a shared volume; each node turns it into a
# dialable multiaddr with the bootstrap container's IPv4 address.
#
#   local-swarm.sh bootstrap [ARGS...]
#       write the peer id of $SWARM_NODE_DATA_DIR to $SWARM_NODE_SHARE_DIR/bootstrap.peer-id
#       (atomically), then exec `swarm-node bootstrap --listen $SWARM_NODE_LISTEN --data-dir ..`
#   local-swarm.sh join [ARGS...]
#       wait up to $BOOTSTRAP_WAIT_S seconds for that file, set SWARM_NODE_BOOTSTRAP to
#       /ip4/<IPv4 of $BOOTSTRAP_HOST>/tcp/$BOOTSTRAP_PORT/p2p/<peer id>, exec `swarm-node join`
set -eu

share_dir="${SWARM_NODE_SHARE_DIR:-/run/swarm-node}"
peer_file="$share_dir/bootstrap.peer-id"
mode="${1:-}"
[ "$#" -gt 0 ] && shift

case "$mode" in
bootstrap)
    peer_id="$(swarm-node identity --data-dir "$SWARM_NODE_DATA_DIR")"
    printf '%s\n' "$peer_id" > "$peer_file.tmp"
    mv "$peer_file.tmp" "$peer_file"
    exec swarm-node bootstrap --listen "$SWARM_NODE_LISTEN" --data-dir "$SWARM_NODE_DATA_DIR" "$@"
    ;;
join)
    host="${BOOTSTRAP_HOST:-bootstrap}"
    waited=0
    while [ ! -s "$peer_file" ]; do
        if [ "$waited" -ge "${BOOTSTRAP_WAIT_S:-120}" ]; then
            echo "local-swarm: no $peer_file after ${waited}s; is the bootstrap service up?" >&2
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    ip="$(getent ahostsv4 "$host" | awk 'NR == 1 { print $1 }')"
    if [ -z "$ip" ]; then
        echo "local-swarm: cannot resolve $host to an IPv4 address" >&2
        exit 1
    fi
    SWARM_NODE_BOOTSTRAP="/ip4/$ip/tcp/${BOOTSTRAP_PORT:-4001}/p2p/$(cat "$peer_file")"
    export SWARM_NODE_BOOTSTRAP
    exec swarm-node join "$@"
    ;;
*)
    echo "usage: local-swarm.sh bootstrap|join [ARGS...]" >&2
    exit 2
    ;;
esac
