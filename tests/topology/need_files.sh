#!/bin/sh
# need_files.sh DIR command [args...]: runs the command, or skips (exit 77, ctest's
# SKIP_RETURN_CODE) with a message when DIR, the shared topology files, is missing.
dir=$1
shift
if [ ! -d "$dir" ]; then
  echo "SKIP: $dir is missing (the shared topology files of ../shared/topologies)"
  exit 77
fi
exec "$@"
