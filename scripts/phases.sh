#!/usr/bin/env bash
# Runs each make target named on the command line in turn, timing each, and prints one line
# per phase at the end (also when a phase fails: the run stops there, the table says where).
# `A|B` runs targets A and B at once, each one's output printed whole as it ends, each timed
# from the group's start: for phases that leave a core idle (test-rust runs its test binaries
# one after another) beside ones that need no build lock of theirs (test-sdist builds in
# target/sdist). The total is the wall time of the whole run.
# Usage: scripts/phases.sh TARGET|TARGET... ...   (from the Makefile: `make test`)
set -uo pipefail
cd "$(dirname "$0")/.."
names=() secs=() rc=0 began_all=$SECONDS failed=
fmt() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

. scripts/as_they_end.sh

# group TARGET...: the targets at once; appends each to names/secs as it ends; returns the
# first failure's status (the others run to their end).
group() {
  local logs start=$SECONDS status=0 i pids=() targets=("$@") joined
  joined=$(IFS='|'; echo "$*")
  logs=$(mktemp -d)
  trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$logs"; exit 143' INT TERM
  for i in "$@"; do
    "${MAKE:-make}" --no-print-directory "$i" >"$logs/${#pids[@]}" 2>&1 &
    pids+=($!)
  done
  as_they_end member_ended "${pids[@]}"
  trap - INT TERM
  rm -rf "$logs"
  return "$status"
}

# member_ended INDEX STATUS: a member of the group running (its locals are in scope here).
member_ended() {
  local i=$1 rc=$2
  cat "$logs/$i"
  echo "== ${targets[$i]}: $([ "$rc" -eq 0 ] && echo done || echo "FAILED (exit $rc)") after $(fmt $((SECONDS - start))) (group $joined)"
  names+=("${targets[$i]}") secs+=($((SECONDS - start)))
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
    status=$rc failed=${targets[$i]}
  fi
}

for target in "$@"; do
  began=$SECONDS
  if [[ $target == *"|"* ]]; then
    IFS='|' read -ra members <<<"$target"
    group "${members[@]}" || rc=$?
  else
    "${MAKE:-make}" --no-print-directory "$target" || { rc=$? failed=$target; }
    names+=("$target") secs+=($((SECONDS - began)))
  fi
  [ "$rc" -eq 0 ] || break
done
echo "== make test phases (those of a group at once, each timed from the group's start)"
for i in "${!names[@]}"; do
  printf '  %-12s %s\n' "${names[$i]}" "$(fmt "${secs[$i]}")"
done
printf '  %-12s %s%s\n' total "$(fmt $((SECONDS - began_all)))" "$([ "$rc" -eq 0 ] || echo " (stopped: $failed failed)")"
exit "$rc"
