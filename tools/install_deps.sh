#!/usr/bin/env bash
# Installs what Loom needs to build and test on Debian 12 (bookworm). Safe to rerun: packages that
# are already installed are skipped, so a warm machine spends no time here.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libfmt-dev nlohmann-json3-dev libcli11-dev libpugixml-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  iproute2 procps python3 clang-format git
  openmpi-bin libopenmpi-dev
  libhwloc-dev hwloc graphviz
  libibverbs-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
