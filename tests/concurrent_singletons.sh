#!/usr/bin/env bash
# Starts many MPI singletons at once, several rounds, and fails if any of them fails.
# Guards the per-process Open MPI session directory (runtime/src/mpi_env.cpp): isolated
# singletons share job family 0, and a shared session directory races one process's
# clean-up against another's MPI_Init (a ctest run in parallel failed this way).
# Usage: concurrent_singletons.sh BINARY GTEST_FILTER [PROCESSES] [ROUNDS]
set -u
bin=$1 filter=$2 n=${3:-12} rounds=${4:-6}
failed=0
for ((r = 0; r < rounds; ++r)); do
  pids=()
  for ((i = 0; i < n; ++i)); do
    "$bin" --gtest_filter="$filter" >/dev/null 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
done
echo "$failed of $((n * rounds)) singletons failed"
[[ $failed -eq 0 ]]
