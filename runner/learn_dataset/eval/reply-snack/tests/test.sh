#!/bin/bash
# Reward 1 when /app/snack.txt holds exactly "pear".
mkdir -p /logs/verifier
if [ "$(cat /app/snack.txt 2>/dev/null)" = "pear" ]; then
  echo "PASS: /app/snack.txt is pear"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/snack.txt missing or not pear"
  echo 0 > /logs/verifier/reward.txt
fi
