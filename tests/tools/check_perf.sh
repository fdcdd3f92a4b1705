#!/bin/sh
# Runs a command and checks its exit status and output (ctest's PASS_REGULAR_EXPRESSION alone
# ignores the exit status).
#   check_perf.sh [--ok|--fail|--status N] [--expect REGEX]... [--absent REGEX]...
#                 [--once REGEX]... [--file PATH REGEX]... -- command args...
# --once: exactly one line of the output matches.
want=ok
expects=""
absents=""
onces=""
files=""
while [ $# -gt 0 ]; do
  case "$1" in
    --ok) want=ok ;;
    --fail) want=fail ;;
    --status) want=$2; shift ;;
    --absent) absents="$absents
$2"; shift ;;
    --once) onces="$onces
$2"; shift ;;
    --expect) expects="$expects
$2"; shift ;;
    --file) files="$files
$2	$3"; shift 2 ;;
    --) shift; break ;;
    *) echo "check_perf.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
status=0
if [ "$want" = ok ] && [ $rc -ne 0 ]; then
  echo "check_perf.sh: exit status $rc, expected 0"
  status=1
fi
if [ "$want" = fail ] && [ $rc -eq 0 ]; then
  echo "check_perf.sh: exit status 0, expected a failure"
  status=1
fi
if [ "$want" != ok ] && [ "$want" != fail ] && [ $rc -ne "$want" ]; then
  echo "check_perf.sh: exit status $rc, expected $want"
  status=1
fi
old_ifs=$IFS
IFS='
'
for re in $absents; do
  if printf '%s\n' "$out" | grep -Eq -- "$re"; then
    echo "check_perf.sh: output has /$re/"
    status=1
  fi
done
for re in $expects; do
  if ! printf '%s\n' "$out" | grep -Eq -- "$re"; then
    echo "check_perf.sh: output lacks /$re/"
    status=1
  fi
done
for re in $onces; do
  n=$(printf '%s\n' "$out" | grep -Ec -- "$re")
  if [ "$n" -ne 1 ]; then
    echo "check_perf.sh: $n lines have /$re/, expected one"
    status=1
  fi
done
for entry in $files; do
  path=${entry%%	*}
  re=${entry#*	}
  if ! grep -Eq -- "$re" "$path" 2>/dev/null; then
    echo "check_perf.sh: $path lacks /$re/"
    status=1
  fi
done
IFS=$old_ifs
exit $status
