#!/usr/bin/env bash
# Downloads the Debian packages hetpar builds against (the libraries of scripts/setup.sh and
# the ones they need at run time) as .deb files into .device/debs/, for a GPU machine that
# has CUDA, CMake and ninja but not these libraries: the `device` tool carries the folder
# (carry: [".device"]) and scripts/device_check.sh unpacks it there. Run here, as root, with
# Debian's package archive reachable; about 19 MB. Nothing is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  # headers (and the few libraries they come with)
  libfmt-dev libfmt9 nlohmann-json3-dev libboost1.74-dev libeigen3-dev libcli11-dev
  libgtest-dev libgmock-dev libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5
  # Open MPI 4.1 (a world of one: an MPI singleton, no mpirun needed) and what it loads
  libopenmpi-dev libopenmpi3 openmpi-common libhwloc15 libhwloc-plugins libevent-core-2.1-7
  libevent-pthreads-2.1-7 libpmix2 libfabric1 libibverbs1 librdmacm1 libnl-3-200
  libnl-route-3-200 libucx0 libpsm2-2 libpsm-infinipath1 libnuma1 libltdl7 libxnvctrl0
)

mkdir -p .device/debs
cd .device/debs
rm -f ./*.deb
if ! apt-get download "${packages[@]}" >/dev/null 2>download.err; then
  apt-get update -qq >/dev/null
  apt-get download "${packages[@]}" >/dev/null 2>download.err
fi
rm -f download.err
echo "device_bundle: $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in .device/debs" >&2
