#!/usr/bin/env bash
# Sets up RDMA support for rq (`rq send/recv --transport rdma`, RDMA lines in `rq doctor`).
#
# What it does, in order:
#   1. Debian packages (when apt-get is there and we are root): the verbs libraries and tools
#      (libibverbs-dev rdma-core librdmacm1 ibverbs-utils perftest), libnl (pyverbs' build needs it)
#      and the C build tools.
#   2. pyverbs into the virtualenv, one of two ways:
#      build  (default) PyPI `pyverbs` 59.0, a source package that bundles rdma-core v59. It builds only
#             with Cython < 3.1, given as a *build* constraint: `pip install --build-constraint FILE` on
#             pip >= 25.3, the PIP_CONSTRAINT environment variable (inherited by the isolated build
#             environment) on older pip. The wheel holds only the Python extension modules, linked
#             against libibverbs.so.1 / librdmacm.so.1 — and Debian bookworm's are v44, which lack the
#             symbol versions v59 needs (`import pyverbs.device` fails with "version `IBVERBS_PRIVATE_59' not
#             found" or similar). So this step also builds the bundled rdma-core v59 *libraries* (C only,
#             no pyverbs) into <venv>/opt/rdma-core; rq's transfer/rdma/verbs.py loads those by path
#             before importing pyverbs (override with RQ_RDMA_LIBDIR), so no LD_LIBRARY_PATH is needed.
#      debian Debian's `python3-pyverbs` 44 instead (built for Debian's python3.11 and its own v44
#             libraries): installed with apt and linked into the virtualenv's site-packages. Older, but
#             nothing to compile. Use it when the build fails or takes too long.
#   3. A check: imports pyverbs the way rq does and lists devices (`ibv_devices`).
#
# Usage: scripts/setup-rdma.sh [--venv DIR] [--debian-pyverbs] [--no-apt] [--jobs N]
# Example: nice -n 19 scripts/setup-rdma.sh            # build from PyPI into ./.venv
#          scripts/setup-rdma.sh --debian-pyverbs      # quick route with Debian's pyverbs 44
#
# A device is still needed to move data: a real InfiniBand/RoCE NIC, or soft-RoCE on any Ethernet NIC
# when the kernel has CONFIG_RDMA_RXE (`modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0`).
# Exit status: 0 pyverbs imports (device or not), 1 a step failed (the message says which).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${REPO}/.venv"
MODE=build
USE_APT=1
JOBS="$(nproc 2>/dev/null || echo 2)"
PYVERBS_VERSION=59.0

while [[ $# -gt 0 ]]; do
    case "$1" in
        --venv) VENV="$2"; shift 2 ;;
        --debian-pyverbs) MODE=debian; shift ;;
        --no-apt) USE_APT=0; shift ;;
        --jobs) JOBS="$2"; shift 2 ;;
        -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup-rdma: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

PY="${VENV}/bin/python"
[[ -x "$PY" ]] || { echo "setup-rdma: no python at ${PY} (give --venv DIR)" >&2; exit 1; }
say() { echo "setup-rdma: $*"; }
fail() { echo "setup-rdma: $*" >&2; exit 1; }

RDMA_PREFIX="${VENV}/opt/rdma-core"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/rq-setup-rdma.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

apt_install() {
    if [[ "$USE_APT" != 1 ]]; then say "skipping apt (--no-apt)"; return; fi
    if ! command -v apt-get >/dev/null; then say "no apt-get: install libnl-3/libnl-route-3 headers, rdma-core and libibverbs headers with your package manager"; return; fi
    local sudo=""
    if [[ "$(id -u)" != 0 ]]; then
        command -v sudo >/dev/null || fail "apt needs root: run as root or install sudo"
        sudo="sudo"
    fi
    say "installing Debian packages: $*"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

pip_supports_build_constraint() {
    "$PY" -m pip install --help 2>/dev/null | grep -q -- '--build-constraint'
}

install_pypi_pyverbs() {
    local constraint="${WORK}/build-constraint.txt"
    echo 'Cython<3.1' >"$constraint"
    export CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
    if pip_supports_build_constraint; then
        say "building pyverbs ${PYVERBS_VERSION} (pip --build-constraint: Cython<3.1)"
        "$PY" -m pip install --no-cache-dir --build-constraint "$constraint" "pyverbs==${PYVERBS_VERSION}"
    else
        say "building pyverbs ${PYVERBS_VERSION} (this pip has no --build-constraint: PIP_CONSTRAINT=Cython<3.1)"
        PIP_CONSTRAINT="$constraint" "$PY" -m pip install --no-cache-dir "pyverbs==${PYVERBS_VERSION}"
    fi
}

build_bundled_libraries() {
    # The same rdma-core v59 the wheel was compiled against, libraries and providers only.
    say "building the bundled rdma-core v59 libraries into ${RDMA_PREFIX}"
    "$PY" -m pip download --no-deps --no-binary :all: -d "$WORK" "pyverbs==${PYVERBS_VERSION}" >/dev/null
    tar -xzf "${WORK}/pyverbs-${PYVERBS_VERSION}.tar.gz" -C "$WORK"
    local src="${WORK}/pyverbs-${PYVERBS_VERSION}/rdma-core"
    cmake -S "$src" -B "${WORK}/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNO_MAN_PAGES=1 -DNO_PYVERBS=1 \
        -DCMAKE_INSTALL_PREFIX="$RDMA_PREFIX" >"${WORK}/cmake.log" 2>&1 || { tail -20 "${WORK}/cmake.log" >&2; fail "cmake of rdma-core failed"; }
    ninja -C "${WORK}/build" -j "$JOBS" install >"${WORK}/ninja.log" 2>&1 || { tail -30 "${WORK}/ninja.log" >&2; fail "building rdma-core failed"; }
}

libdir_of_prefix() {
    for d in "${RDMA_PREFIX}/lib" "${RDMA_PREFIX}/lib64" "${RDMA_PREFIX}/lib/x86_64-linux-gnu"; do
        [[ -e "${d}/libibverbs.so.1" ]] && { echo "$d"; return; }
    done
}

# Imports pyverbs exactly the way rq does (transfer/rdma/verbs.py), then asks for devices.
check_import() {
    (cd "$REPO" && "$PY" - <<'EOF')
from transfer.rdma import devices, verbs
from transfer.rdma.errors import RdmaUnavailable
verbs.load()
print("setup-rdma: pyverbs imports:", verbs.describe_build())
try:
    found = devices.describe_devices()
    print("setup-rdma: devices:", ", ".join(d.name for d in found))
except RdmaUnavailable as exc:
    print("setup-rdma: pyverbs works, but:", exc.reason)
EOF
}

install_debian_pyverbs() {
    apt_install python3-pyverbs rdma-core ibverbs-utils perftest
    local dist=/usr/lib/python3/dist-packages/pyverbs
    [[ -d "$dist" ]] || fail "python3-pyverbs did not install ${dist}"
    local site
    site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')"
    local want have
    want="$(/usr/bin/python3 -c 'import sys; print(sys.version_info[:2])' 2>/dev/null || echo none)"
    have="$("$PY" -c 'import sys; print(sys.version_info[:2])')"
    [[ "$want" == "$have" ]] || fail "Debian's pyverbs is built for python ${want}, the venv runs ${have}: use the build route"
    ln -sfn "$dist" "${site}/pyverbs"
    say "linked ${dist} into ${site}"
}

if [[ "$MODE" == debian ]]; then
    install_debian_pyverbs
    check_import || fail "pyverbs from Debian does not import"
else
    apt_install libnl-3-dev libnl-route-3-dev libibverbs-dev rdma-core librdmacm1 ibverbs-utils perftest \
        cmake ninja-build pkg-config gcc libc6-dev
    if ! "$PY" -c 'import pyverbs' 2>/dev/null; then
        install_pypi_pyverbs || fail "pip could not build pyverbs ${PYVERBS_VERSION} (try --debian-pyverbs)"
    else
        say "pyverbs already installed in ${VENV}"
    fi
    if [[ -z "$(libdir_of_prefix)" ]]; then
        if (cd "$REPO" && RQ_RDMA_LIBDIR=/nonexistent "$PY" -c 'import pyverbs.device' 2>"${WORK}/import.err"); then
            say "the system libibverbs is new enough; no bundled libraries needed"
        else
            say "the system libibverbs does not fit pyverbs ${PYVERBS_VERSION}: $(tail -1 "${WORK}/import.err")"
            build_bundled_libraries
        fi
    fi
    check_import || fail "pyverbs still does not import (try --debian-pyverbs)"
fi

if command -v ibv_devices >/dev/null; then
    say "ibv_devices says:"
    ibv_devices || true
fi
say "done"
