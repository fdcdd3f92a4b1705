#!/usr/bin/env bash
# Fails (listing the files) when a C/C++ source is not formatted by clang-format with the
# project's .clang-format. tools/check_format.sh --fix formats them in place.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "check_format: clang-format is not installed (tools/install_deps.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.c' 2>/dev/null || find . -path ./build\* -prune -o \( -name '*.cc' -o -name '*.h' -o -name '*.c' \) -print)
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if [ ${#bad[@]} -ne 0 ]; then
  echo "check_format: not clang-formatted (run tools/check_format.sh --fix):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files OK"
