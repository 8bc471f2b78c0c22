#!/bin/busybox sh
# /usr/bin/bounded in the guest test initramfs (busybox ash).
#
#   bounded SECONDS COMMAND [ARGS...]
#
# Runs COMMAND in the background and waits at most SECONDS for it. Prints what
# became of it on the last line: "bounded: exit N after T s", or "bounded: still
# running after SECONDS s (left behind)" and status 124. A process stuck in the
# kernel on a device that never answers cannot be killed; it is left behind, the
# caller goes on, and the guest powers off at the end all the same. Its output so
# far is printed either way.
# shellcheck shell=sh

[ $# -ge 2 ] || {
    echo "usage: bounded SECONDS COMMAND [ARGS...]" >&2
    exit 2
}
limit=$1
shift
out=$(mktemp /tmp/bounded.XXXXXX)
start=$(cut -d' ' -f1 /proc/uptime)
"$@" >"$out" 2>&1 &
pid=$!
t=0
while [ -d "/proc/$pid" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; do
    if [ "$t" -ge $((limit * 10)) ]; then
        cat "$out"
        echo "bounded: still running after $limit s (left behind): $*"
        # The command and its children (fio runs its jobs in a child): where each waits.
        for st in /proc/[0-9]*/status; do
            p=${st#/proc/}
            p=${p%/status}
            [ "$p" = "$pid" ] || grep -q "^PPid:[[:space:]]*$pid\$" "$st" 2>/dev/null || continue
            echo "bounded: pid $p $(awk '/^Name:/ { n = $2 } /^State:/ { sub(/^State:[ \t]*/, ""); s = $0 } END { print n ", " s }' "$st")," \
                "waiting in $(cat "/proc/$p/wchan" 2>/dev/null)"
        done
        exit 124
    fi
    sleep 0.1
    t=$((t + 1))
done
rc=0
wait "$pid" || rc=$?
cat "$out"
rm -f "$out"
echo "bounded: exit $rc after $(awk -v s="$start" '{ printf "%.1f", $1 - s }' /proc/uptime) s: $*"
exit "$rc"
