#!/usr/bin/env bash
# Installs what Loom needs to build and test on Debian 12 (bookworm). Safe to rerun: packages that
# are already installed are skipped, so a warm machine spends no time here.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache
  libfmt-dev nlohmann-json3-dev libcli11-dev libpugixml-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  iproute2 procps python3 clang-format git
  clang libclang-rt-14-dev llvm
  openmpi-bin libopenmpi-dev
  libhwloc-dev hwloc graphviz
  libibverbs-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
else
  echo "install_deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# PyTorch for loom_torch (src/torch) and its tests, from PyPI into the python3 on PATH: 1.5 to 2
# minutes and 5.3 GB on a fresh machine (the Linux wheel brings NVIDIA's CUDA runtime wheels along; CPU
# tensors need none of them), nothing when present. LOOM_NO_TORCH=1 skips it (the torch tests then
# skip, saying why).
if [ "${LOOM_NO_TORCH:-0}" != 1 ]; then
  if python3 -c "import torch, numpy" 2>/dev/null; then
    echo "install_deps: torch $(python3 -c 'import torch; print(torch.__version__)') present"
  else
    echo "install_deps: pip install torch numpy"
    python3 -m pip install -q torch numpy
  fi
fi
# matplotlib for tools/plot_results.py (pictures of loom-perf and loom-sim results, and of
# bench/peers' report), from PyPI beside that numpy: about 10 s.
if python3 -c "import matplotlib" 2>/dev/null; then
  echo "install_deps: matplotlib present"
else
  echo "install_deps: pip install matplotlib"
  python3 -m pip install -q matplotlib
fi
