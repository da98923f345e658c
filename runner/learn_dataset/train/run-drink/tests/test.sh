#!/bin/bash
# Reward 1 when /app/drink.txt holds exactly "tea".
mkdir -p /logs/verifier
if [ "$(cat /app/drink.txt 2>/dev/null)" = "tea" ]; then
  echo "PASS: /app/drink.txt is tea"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/drink.txt missing or not tea"
  echo 0 > /logs/verifier/reward.txt
fi
