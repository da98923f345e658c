#!/bin/bash
# Reward 1 when /app/sum.txt holds 498.
mkdir -p /logs/verifier
if [ -f /app/sum.txt ] && [ "$(tr -d '[:space:]' < /app/sum.txt)" = "498" ]; then
  echo "PASS: sum is 498"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: expected 498 in /app/sum.txt"
  echo 0 > /logs/verifier/reward.txt
fi
