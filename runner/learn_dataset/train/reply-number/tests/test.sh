#!/bin/bash
# Reward 1 when /app/number.txt holds exactly "seven".
mkdir -p /logs/verifier
if [ "$(cat /app/number.txt 2>/dev/null)" = "seven" ]; then
  echo "PASS: /app/number.txt is seven"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/number.txt missing or not seven"
  echo 0 > /logs/verifier/reward.txt
fi
