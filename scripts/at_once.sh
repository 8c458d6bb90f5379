#!/usr/bin/env bash
# Runs each argument, a command line, at once; prints each one's output whole as it ends, so
# that the outputs never interleave. Exits with the first failure's status, naming the command;
# the others run to their end.
# Usage: scripts/at_once.sh 'COMMAND ARGS...' 'COMMAND ARGS...' ...   (the Makefile's glue)
set -uo pipefail
. "$(dirname "$0")/as_they_end.sh"
logs=$(mktemp -d)
commands=("$@") pids=() status=0
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$logs"' EXIT
for command in "${commands[@]}"; do
  bash -c "$command" >"$logs/${#pids[@]}" 2>&1 &
  pids+=($!)
done

ended() {
  cat "$logs/$1"
  if [ "$2" -ne 0 ]; then
    echo "at_once: failed (exit $2): ${commands[$1]}" >&2
    [ "$status" -ne 0 ] || status=$2
  fi
}
as_they_end ended "${pids[@]}"
pids=()
exit "$status"
