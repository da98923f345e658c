#!/bin/bash
# Reward 1 when /app/color.txt holds exactly "blue".
mkdir -p /logs/verifier
if [ "$(cat /app/color.txt 2>/dev/null)" = "blue" ]; then
  echo "PASS: /app/color.txt is blue"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/color.txt missing or not blue"
  echo 0 > /logs/verifier/reward.txt
fi
