#!/usr/bin/env bash
# Runs each make target named on the command line in turn, timing each, and prints one line
# per phase at the end (also when a phase fails: the run stops there, the table says where).
# Usage: scripts/phases.sh TARGET...   (from the Makefile: `make test`)
set -uo pipefail
cd "$(dirname "$0")/.."
names=() secs=() rc=0
fmt() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
for target in "$@"; do
  began=$SECONDS
  "${MAKE:-make}" --no-print-directory "$target" || rc=$?
  names+=("$target") secs+=($((SECONDS - began)))
  [ "$rc" -eq 0 ] || break
done
total=0
echo "== make test phases"
for i in "${!names[@]}"; do
  total=$((total + secs[i]))
  printf '  %-12s %s\n' "${names[$i]}" "$(fmt "${secs[$i]}")"
done
printf '  %-12s %s%s\n' total "$(fmt "$total")" "$([ "$rc" -eq 0 ] || echo " (stopped: ${names[-1]} failed)")"
exit "$rc"
