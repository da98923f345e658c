#!/bin/bash
# Reward 1 when /app/direction.txt holds exactly "north".
mkdir -p /logs/verifier
if [ "$(cat /app/direction.txt 2>/dev/null)" = "north" ]; then
  echo "PASS: /app/direction.txt is north"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/direction.txt missing or not north"
  echo 0 > /logs/verifier/reward.txt
fi
