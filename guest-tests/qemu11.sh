#!/usr/bin/env bash
# QEMU 11.1 on Debian bookworm, from a Debian trixie root (root only).
#
# QEMU 11.1.x (vfio-user-pci, vhost-user-test-device-pci, sdhci-pci + emmc) is in
# trixie-backports and needs trixie's glibc, so it runs in a chroot: a minimal trixie
# tree built with debootstrap under guest-tests/work/qemu11/root, with qemu-system-x86
# from trixie-backports installed inside. Only Debian's archive is used.
#
#   guest-tests/qemu11.sh install        build the root if it is not complete (1 to 5
#                                        minutes the first time, nothing the second)
#   guest-tests/qemu11.sh check          exit 0 if the root is complete, 1 if not
#   guest-tests/qemu11.sh version        the installed QEMU version (from the stamp)
#   guest-tests/qemu11.sh run [--bind DIR]... -- QEMU-ARGS...
#                                        run qemu-system-x86_64 in the root
#   guest-tests/qemu11.sh download DIR PACKAGE...
#                                        apt-get download trixie packages (e.g. a guest
#                                        kernel) with the root's apt into DIR
#   guest-tests/qemu11.sh remove         delete the root
#
# `run` binds /proc, /sys, /dev, /dev/shm and each --bind DIR into the root at the same
# path, so that a command line names sockets, kernels and images as outside. The mounts
# are made in a private mount namespace (unshare) that ends with QEMU, and a trap
# unmounts them on every exit path as well: nothing is left mounted when QEMU fails or
# is killed, and runs at the same time do not see each other's mounts.
#
# Environment: QEMU11_DIR (default $GUEST_CACHE/qemu11, GUEST_CACHE defaulting to
# guest-tests/work), QEMU11_MIRROR (default: the Debian archive the host's apt sources
# name for bookworm, else http://deb.debian.org/debian).
# See guest-tests/README.md, "QEMU 11.1".
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
QEMU11_DIR=${QEMU11_DIR:-${GUEST_CACHE:-$HERE/work}/qemu11}

# The Debian archive the host's apt takes bookworm from (the suite itself, -updates or
# -backports; -security is another archive), in one-line .list or deb822 .sources
# files, so that the root comes from the mirror the machine already uses.
q11_host_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -r $f ]] || continue
        awk 'BEGIN { RS = ""; FS = "\n" }
            {
                types = ""; uris = ""; suites = ""; enabled = "yes"
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^Types:/) types = $i
                    else if ($i ~ /^URIs:/) uris = $i
                    else if ($i ~ /^Suites:/) suites = $i
                    else if ($i ~ /^Enabled:/) enabled = $i
                }
                if (types ~ /[ \t]deb([ \t]|$)/ && suites ~ /[ \t]bookworm(-updates|-backports)?([ \t]|$)/ &&
                    enabled !~ /no/) {
                    sub(/^URIs:[ \t]*/, "", uris); split(uris, u, /[ \t]+/); print u[1]
                }
            }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -r $f ]] || continue
        awk '$1 == "deb" {
                i = 2
                if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                if ($(i + 1) ~ /^bookworm(-updates|-backports)?$/) print $i
            }' "$f"
    done
}
if [[ -z ${QEMU11_MIRROR:-} ]]; then
    QEMU11_MIRROR=$(q11_host_mirror)
    QEMU11_MIRROR=${QEMU11_MIRROR%%$'\n'*}
    QEMU11_MIRROR=${QEMU11_MIRROR%/}
    : "${QEMU11_MIRROR:=http://deb.debian.org/debian}"
fi
QEMU11_SUITE=trixie
# The QEMU this root must hold: the package, its version range, the devices it lists.
QEMU11_PKG=qemu-system-x86
QEMU11_MIN=1:11.1~
QEMU11_BELOW=1:11.2~
QEMU11_DEVICES=(vfio-user-pci vhost-user-test-device-pci sdhci-pci emmc)
# What a complete root was built for; a stamp with another key is rebuilt.
QEMU11_KEY="qemu11-root v1 suite=$QEMU11_SUITE variant=minbase mirror=$QEMU11_MIRROR pkg=$QEMU11_PKG/$QEMU11_SUITE-backports>=$QEMU11_MIN<$QEMU11_BELOW devices=${QEMU11_DEVICES[*]}"

q11_log() { printf '== qemu11: %s\n' "$*" >&2; }
q11_die() {
    printf 'qemu11: error: %s\n' "$*" >&2
    exit 2
}

q11_root() { echo "$QEMU11_DIR/root"; }
q11_stamp() { echo "$QEMU11_DIR/root.stamp"; }

# True when the root is complete and holds the QEMU this script wants.
q11_ready() {
    local root stamp
    root=$(q11_root)
    stamp=$(q11_stamp)
    [[ -f $stamp && -x $root/usr/bin/qemu-system-x86_64 ]] || return 1
    [[ $(head -n 1 "$stamp") == "$QEMU11_KEY" ]]
}

# The QEMU version recorded when the root was built.
q11_version() {
    q11_ready || return 1
    awk -F': ' '$1 == "qemu" { print $2 }' "$(q11_stamp)"
}

# Runs a command, saying what and how long it took; its output goes to LOG.
q11_step() {
    local what=$1 logfile=$2 t0=$SECONDS
    shift 2
    q11_log "$what ..."
    if ! "$@" >>"$logfile" 2>&1; then
        tail -n 25 "$logfile" >&2
        q11_die "$what failed after $((SECONDS - t0)) s (full log: $logfile)"
    fi
    q11_log "$what: done in $((SECONDS - t0)) s"
}

# Mount points at or under DIR in this mount namespace, deepest first.
q11_mounts_under() {
    local dir=$1
    awk -v d="$dir" '{ gsub(/\\040/, " ", $5); if ($5 == d || index($5, d "/") == 1) print $5 }' \
        /proc/self/mountinfo | sort -r
}

# Deletes the root. Refuses to while anything is mounted in it (a bind mount of /dev
# or /proc under rm -rf would delete the host's files); a run's mounts live in its
# own mount namespace and never show here.
q11_remove_root() {
    local root m
    root=$(q11_root)
    [[ -e $root ]] || return 0
    while read -r m; do
        [[ -n $m ]] || continue
        q11_log "unmounting leftover $m"
        umount -l "$m" || q11_die "cannot unmount $m; not deleting $root"
    done < <(q11_mounts_under "$root")
    [[ -z $(q11_mounts_under "$root") ]] || q11_die "something is still mounted under $root"
    rm -f "$(q11_stamp)"
    rm -rf --one-file-system "$root"
}

q11_need_root() {
    [[ $EUID == 0 ]] || q11_die "$1 needs root (debootstrap, chroot and mounts)"
}

# debootstrap on the host, from bookworm (or bookworm-backports if bookworm's does not
# know the suite).
q11_ensure_debootstrap() {
    if command -v debootstrap >/dev/null && [[ -e /usr/share/debootstrap/scripts/$QEMU11_SUITE ]]; then
        return 0
    fi
    [[ ${GUEST_NO_INSTALL:-0} != 1 ]] || q11_die "debootstrap missing and GUEST_NO_INSTALL=1"
    q11_log "installing on the host: debootstrap (Debian package, bookworm)"
    q11_step "apt-get update (host)" "$QEMU11_DIR/build.log" apt-get update -q
    q11_step "apt-get install debootstrap (host)" "$QEMU11_DIR/build.log" \
        env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
    if [[ ! -e /usr/share/debootstrap/scripts/$QEMU11_SUITE ]]; then
        q11_log "bookworm's debootstrap does not know $QEMU11_SUITE: installing it from bookworm-backports"
        q11_step "apt-get install -t bookworm-backports debootstrap (host)" "$QEMU11_DIR/build.log" \
            env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            -t bookworm-backports debootstrap
    fi
    [[ -e /usr/share/debootstrap/scripts/$QEMU11_SUITE ]] ||
        q11_die "debootstrap has no script for $QEMU11_SUITE"
}

# Runs "$@" inside the root (chroot) in a private mount namespace with /proc, /sys,
# /dev and /dev/shm bound, for the install steps.
q11_chroot() {
    local root
    root=$(q11_root)
    # shellcheck disable=SC2016 # expanded by the inner bash
    unshare --mount --propagation private -- bash -euc '
        root=$1; shift
        mount --bind /proc "$root/proc"
        mount --bind /sys "$root/sys"
        mount --bind /dev "$root/dev"
        mkdir -p "$root/dev/shm"
        mount --bind /dev/shm "$root/dev/shm"
        exec chroot "$root" "$@"' q11-chroot "$root" "$@"
}

# Builds the root if it is not complete. Idempotent; serialised by a lock file.
q11_install() {
    local root stamp lock t0=$SECONDS version devices d missing=()
    q11_need_root "building the QEMU 11 root"
    mkdir -p "$QEMU11_DIR"
    root=$(q11_root)
    stamp=$(q11_stamp)
    exec {lock}>"$QEMU11_DIR/lock"
    flock "$lock"
    if q11_ready; then
        q11_log "root ready: $root, QEMU $(q11_version) (stamp $stamp)"
        exec {lock}>&-
        return 0
    fi
    q11_log "building a Debian $QEMU11_SUITE root in $root for QEMU 11.1 (1 to 5 minutes, depending on the mirror)"
    q11_log "it installs: debootstrap on the host if missing; in the root, $QEMU11_SUITE's" \
        "minbase packages from $QEMU11_MIRROR, then $QEMU11_PKG from $QEMU11_SUITE-backports" \
        "(--no-install-recommends; the root takes about 350 MB); nothing else on the host"
    if [[ -e $root ]]; then
        q11_log "removing an incomplete or outdated root"
        q11_remove_root
    fi
    : >"$QEMU11_DIR/build.log"
    q11_ensure_debootstrap
    # debootstrap runs in a mount namespace of its own too: a failure cannot leave its
    # /proc or /sys mounts in the root.
    q11_step "debootstrap --variant=minbase $QEMU11_SUITE" "$QEMU11_DIR/build.log" \
        unshare --mount --propagation private -- \
        debootstrap --variant=minbase "$QEMU11_SUITE" "$root" "$QEMU11_MIRROR"
    cat >"$root/etc/apt/sources.list.d/$QEMU11_SUITE-backports.list" <<EOF
deb $QEMU11_MIRROR $QEMU11_SUITE-backports main
EOF
    cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    # No daemons start inside the chroot.
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod 0755 "$root/usr/sbin/policy-rc.d"
    q11_step "apt-get update (in the root)" "$QEMU11_DIR/build.log" \
        q11_chroot apt-get update -q
    q11_step "apt-get install -t $QEMU11_SUITE-backports $QEMU11_PKG (in the root)" "$QEMU11_DIR/build.log" \
        q11_chroot env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends -t "$QEMU11_SUITE-backports" "$QEMU11_PKG"
    q11_chroot apt-get clean >>"$QEMU11_DIR/build.log" 2>&1 || true

    # shellcheck disable=SC2016 # a dpkg-query format, not a shell expansion
    version=$(q11_chroot dpkg-query -W -f='${Version}' "$QEMU11_PKG") ||
        q11_die "$QEMU11_PKG is not installed in the root"
    if ! dpkg --compare-versions "$version" ge "$QEMU11_MIN" ||
        ! dpkg --compare-versions "$version" lt "$QEMU11_BELOW"; then
        q11_die "$QEMU11_SUITE-backports gave $QEMU11_PKG $version, not 11.1.x (update QEMU11_MIN/BELOW in $0)"
    fi
    devices=$(q11_chroot qemu-system-x86_64 -device help 2>&1) ||
        q11_die "qemu-system-x86_64 -device help failed in the root: $devices"
    for d in "${QEMU11_DEVICES[@]}"; do
        grep -q "^name \"$d\"" <<<"$devices" || missing+=("$d")
    done
    [[ ${#missing[@]} == 0 ]] || q11_die "QEMU $version in the root lacks: ${missing[*]}"
    {
        echo "$QEMU11_KEY"
        echo "qemu: $version"
        echo "qemu-version: $(q11_chroot qemu-system-x86_64 --version | head -n 1)"
        echo "devices: ${QEMU11_DEVICES[*]} (all listed by -device help)"
        echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) in $((SECONDS - t0)) s"
    } >"$stamp.tmp"
    mv "$stamp.tmp" "$stamp"
    q11_log "root ready in $((SECONDS - t0)) s: QEMU $version; -device help lists ${QEMU11_DEVICES[*]}"
    exec {lock}>&-
}

# apt-get download of trixie packages into DIR with the root's apt (a bookworm host's
# apt cannot check trixie's signatures on its own): for the guest tests' trixie kernel.
# Updates the root's package lists first when one of the packages is not in them.
q11_download() {
    local dir root tmp lock p
    q11_need_root "downloading with the root's apt"
    [[ $# -ge 2 ]] || q11_die "usage: $0 download DIR PACKAGE..."
    dir=$1
    shift
    [[ -d $dir ]] || q11_die "download: not a directory: $dir"
    q11_ready || q11_die "no complete QEMU 11 root in $(q11_root): run '$0 install' first"
    root=$(q11_root)
    exec {lock}>"$QEMU11_DIR/lock"
    flock "$lock"
    for p in "$@"; do
        if ! q11_chroot apt-cache show "$p" >/dev/null 2>&1; then
            q11_step "apt-get update (in the root, for $p)" "$QEMU11_DIR/build.log" \
                q11_chroot apt-get update -q
            break
        fi
    done
    tmp=/var/tmp/q11-download
    rm -rf "${root:?}$tmp"
    mkdir -p "$root$tmp"
    # shellcheck disable=SC2016 # expanded by the chroot's sh
    q11_step "apt-get download $* (in the root)" "$QEMU11_DIR/build.log" \
        q11_chroot sh -c 'cd "$1" && shift && apt-get -q -o APT::Sandbox::User=root download "$@"' \
        q11-download "$tmp" "$@"
    mv "$root$tmp"/*.deb "$dir/"
    rm -rf "${root:?}$tmp"
    exec {lock}>&-
}

# Runs qemu-system-x86_64 from the root with /proc, /sys, /dev, /dev/shm and the given
# directories bound at their own paths. Re-enters this script in a private mount
# namespace; the mounts are undone by a trap, and by the kernel when the namespace
# ends in any case.
q11_run() {
    local binds=()
    q11_need_root "running QEMU from the root"
    while [[ $# -gt 0 ]]; do
        case $1 in
        --bind) [[ $# -ge 2 ]] || q11_die "--bind needs a directory"; binds+=("$2"); shift 2 ;;
        --) shift; break ;;
        *) break ;;
        esac
    done
    q11_ready || q11_die "no complete QEMU 11 root in $(q11_root): run '$0 install' first"
    exec unshare --mount --propagation private -- "$HERE/qemu11.sh" __run-in-namespace \
        "${#binds[@]}" "${binds[@]}" "$@"
}

Q11_MOUNTED=()
Q11_CHILD=
# shellcheck disable=SC2317 # invoked by traps
q11_unmount_all() {
    local i
    for ((i = ${#Q11_MOUNTED[@]} - 1; i >= 0; i--)); do
        umount "${Q11_MOUNTED[i]}" 2>/dev/null || umount -l "${Q11_MOUNTED[i]}" 2>/dev/null || true
    done
    Q11_MOUNTED=()
}
q11_bind() {
    local src=$1 dst
    dst=$(q11_root)$src
    [[ -d $src ]] || q11_die "--bind: not a directory: $src"
    mkdir -p "$dst"
    mount --bind "$src" "$dst" || q11_die "mount --bind $src $dst failed"
    Q11_MOUNTED+=("$dst")
}
# shellcheck disable=SC2317 # invoked by traps
q11_forward() {
    [[ -z $Q11_CHILD ]] || kill -"$1" "$Q11_CHILD" 2>/dev/null || true
}
q11_run_in_namespace() {
    local n=$1 root dirs=() d rc=0
    shift
    dirs=("${@:1:n}")
    shift "$n"
    root=$(q11_root)
    trap q11_unmount_all EXIT
    trap 'q11_forward TERM' TERM
    trap 'q11_forward INT' INT
    trap 'q11_forward HUP' HUP
    # Each directory by its real path, once, parents before children.
    local real=()
    for d in "${dirs[@]}"; do
        [[ -d $d ]] || q11_die "--bind: no such directory: $d"
        real+=("$(realpath -e "$d")")
    done
    q11_bind /proc
    q11_bind /sys
    q11_bind /dev
    q11_bind /dev/shm
    while read -r d; do
        [[ -n $d ]] && q11_bind "$d"
    done < <(printf '%s\n' "${real[@]}" | awk 'NF { print length($0) "\t" $0 }' | sort -n -u | cut -f2-)
    # A child, not exec: the traps stay to forward signals and unmount. If this
    # script is killed outright (SIGKILL, no trap), QEMU gets SIGTERM from the
    # kernel (parent-death signal) and the namespace with its mounts goes with it.
    setpriv --pdeathsig TERM -- chroot "$root" qemu-system-x86_64 "$@" &
    Q11_CHILD=$!
    while true; do
        rc=0
        wait "$Q11_CHILD" || rc=$?
        # wait returns early (status > 128) when a trapped signal arrives.
        kill -0 "$Q11_CHILD" 2>/dev/null || break
    done
    Q11_CHILD=
    exit "$rc"
}

q11_main() {
    local cmd=${1:-}
    [[ $# -gt 0 ]] && shift
    case $cmd in
    install) q11_install ;;
    check) q11_ready ;;
    version) q11_version ;;
    run) q11_run "$@" ;;
    download) q11_download "$@" ;;
    __run-in-namespace) q11_run_in_namespace "$@" ;;
    remove)
        q11_need_root "removing the root"
        q11_remove_root
        ;;
    -h | --help | help | "") sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" ;;
    *) q11_die "unknown command: $cmd (install, check, version, run, download, remove)" ;;
    esac
}

# Sourced by the guest scripts for the q11_* functions; run directly for the commands.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    q11_main "$@"
fi
