#!/bin/bash
# Verifier of the tiny terminal-bench style task `gym-substrate/hello` (see ../task.json).
# terminal_bench_2_1's verify() uploads this folder to /tests, runs `bash /tests/test.sh` in the
# task's sandbox and downloads /logs/verifier/reward.txt.
mkdir -p /logs/verifier
line1="$(sed -n 1p /app/answer.txt 2>/dev/null)"
line2="$(sed -n 2p /app/answer.txt 2>/dev/null)"
echo "answer.txt: [$line1] [$line2]"
# Line 2 is EXECD_API_GRACE_SHUTDOWN as the agent's shell saw it: terminal_bench_2_1's stock
# sandbox_config sets it to 50ms when the resources server creates the sandbox, and the terminus
# agent reattaches by sandbox id alone, so it arrives only if the sandbox keeps its env.
if [ "$line1" = "hello substrate" ] && [ "$line2" = "50ms" ]; then
  echo 1 > /logs/verifier/reward.txt
  echo PASS
else
  echo 0 > /logs/verifier/reward.txt
  echo FAIL
fi
