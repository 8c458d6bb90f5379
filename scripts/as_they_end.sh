# Sourced by scripts/phases.sh and scripts/pytest_envs.sh, which run jobs at once and print
# each one's output whole as it ends.
# as_they_end CALLBACK PID...: waits for the background jobs PID..., and as each ends calls
# `CALLBACK INDEX STATUS` (INDEX: its place among the PIDs given; STATUS: its exit status).
as_they_end() {
  local callback=$1 done_pid rc i
  shift
  local pids=("$@") running=("$@") still
  while [ "${#running[@]}" -gt 0 ]; do
    wait -n -p done_pid "${running[@]}"
    rc=$?
    still=()
    for i in "${!pids[@]}"; do
      if [ "${pids[$i]}" = "$done_pid" ]; then
        "$callback" "$i" "$rc"
      elif [[ " ${running[*]} " == *" ${pids[$i]} "* ]]; then
        still+=("${pids[$i]}")
      fi
    done
    running=("${still[@]}")
  done
}
