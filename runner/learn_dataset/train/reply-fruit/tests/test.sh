#!/bin/bash
# Reward 1 when /app/fruit.txt holds exactly "apple".
mkdir -p /logs/verifier
if [ "$(cat /app/fruit.txt 2>/dev/null)" = "apple" ]; then
  echo "PASS: /app/fruit.txt is apple"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/fruit.txt missing or not apple"
  echo 0 > /logs/verifier/reward.txt
fi
