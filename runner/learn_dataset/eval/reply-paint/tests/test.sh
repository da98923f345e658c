#!/bin/bash
# Reward 1 when /app/paint.txt holds exactly "green".
mkdir -p /logs/verifier
if [ "$(cat /app/paint.txt 2>/dev/null)" = "green" ]; then
  echo "PASS: /app/paint.txt is green"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/paint.txt missing or not green"
  echo 0 > /logs/verifier/reward.txt
fi
