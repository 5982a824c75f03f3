# Clean Debian roots for the packaging checks (sourced by test-debian.sh and python/test-python.sh; needs root).
# The caller runs in a private mount namespace (enter_private_namespace), sets `work` (a scratch directory) and
# calls cleanup_roots on exit: every mount made here is recorded in `mounts` and undone there.
mirror=${ZERO_DEBIAN_MIRROR:-http://deb.debian.org/debian}
roots_cache=${XDG_CACHE_HOME:-$HOME/.cache}/libzero
mounts=()
host_certificates=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}

# Re-runs the calling script in a private mount namespace: the chroots' mounts never reach the host, and they vanish
# with the namespace even if the script is killed.
enter_private_namespace() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "$(basename "$0") needs root (it works in chroots)" >&2
    exit 1
  fi
  if [[ -z ${ZERO_CHROOTS_NS:-} ]]; then
    exec unshare --mount --propagation private env ZERO_CHROOTS_NS=1 bash "$0" "$@"
  fi
}

# Undoes the mounts; fails when any is left under `work`, so that the caller's `rm -rf` of `work` never reaches
# into a host directory bound there (the ccache directory, the torch venv).
cleanup_roots() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
  if [[ -n ${work:-} ]] && findmnt -rno TARGET | grep -q "^$work/"; then
    echo "mounts are left under $work: not removing it" >&2
    return 1
  fi
}

# minbase_tarball SUITE: prints the path of SUITE's minbase root as a tarball, debootstrapped once (about 25 s,
# 200 MB) and kept in ~/.cache/libzero (ZERO_DEBIAN_BASE overrides bookworm's path). A release that has left the
# mirror (Debian 11 will move to archive.debian.org) takes its own: ZERO_DEBIAN_MIRROR_<SUITE>, e.g.
# ZERO_DEBIAN_MIRROR_BULLSEYE=http://archive.debian.org/debian.
minbase_tarball() {
  local suite=$1 tarball suite_mirror_var suite_mirror
  tarball=$roots_cache/debian-$suite-minbase.tar
  [[ $suite == bookworm && -n ${ZERO_DEBIAN_BASE:-} ]] && tarball=$ZERO_DEBIAN_BASE
  suite_mirror_var=ZERO_DEBIAN_MIRROR_${suite^^}
  suite_mirror=${!suite_mirror_var:-$mirror}
  if [[ ! -f $tarball ]]; then
    echo "debootstrap $suite (minbase) from $suite_mirror, kept in $tarball" >&2
    mkdir -p "$(dirname "$tarball")" "$work/bootstrap-$suite"
    debootstrap --variant=minbase "$suite" "$work/bootstrap-$suite" "$suite_mirror" >"$work/debootstrap-$suite.log" 2>&1 || {
      tail -30 "$work/debootstrap-$suite.log" >&2
      echo "debootstrap $suite failed: if $suite has left $suite_mirror, set $suite_mirror_var" >&2
      return 1
    }
    tar -C "$work/bootstrap-$suite" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf --one-file-system "$work/bootstrap-$suite"
  fi
  echo "$tarball"
}

# new_root DIR TARBALL: a fresh root from a tarball, with /proc, /sys (hwloc, for Open MPI, reads the CPU topology
# there), /dev, a /dev/shm of its own (Open MPI needs one), the host's DNS and the host's certificate authorities
# for pip (where the host reaches PyPI through a proxy of its own, the root must trust what the host trusts).
new_root() {
  local dir=$1 tarball=$2
  mkdir -p "$dir"
  tar -C "$dir" -xf "$tarball"
  mount -t proc proc "$dir/proc"
  mounts+=("$dir/proc")
  mount -t sysfs sysfs "$dir/sys"
  mounts+=("$dir/sys")
  mount --bind /dev "$dir/dev"
  mounts+=("$dir/dev")
  mount -t tmpfs -o size=1g tmpfs "$dir/dev/shm"
  mounts+=("$dir/dev/shm")
  cp /etc/resolv.conf "$dir/etc/resolv.conf"
  cp "${host_certificates}" "$dir/etc/host-ca-certificates.crt"
}

# bind_into ROOT HOST_DIR PATH_IN_ROOT [ro]: a host directory seen inside the root (read-only with "ro").
bind_into() {
  local dir=$1 host=$2 inside=$3 mode=${4:-rw}
  mkdir -p "$host" "$dir$inside"
  mount --bind "$host" "$dir$inside"
  mounts+=("$dir$inside")
  if [[ $mode == ro ]]; then mount -o remount,bind,ro "$dir$inside"; fi
}

# in_root DIR COMMAND...: runs a command in the root with a clean environment.
in_root() {
  local dir=$1
  shift
  chroot "$dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive PIP_CERT=/etc/host-ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1 \
    bash -euo pipefail -c "$*"
}

# keep_root DIR TARBALL: DIR's root saved as TARBALL (its mounts left out), replacing older ones that share
# TARBALL's name up to its last '-'.
keep_root() {
  local dir=$1 tarball=$2
  rm -f "${tarball%-*}"-*.tar
  tar --one-file-system -C "$dir" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
}
