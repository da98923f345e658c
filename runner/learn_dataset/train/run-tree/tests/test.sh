#!/bin/bash
# Reward 1 when /app/tree.txt holds exactly "oak".
mkdir -p /logs/verifier
if [ "$(cat /app/tree.txt 2>/dev/null)" = "oak" ]; then
  echo "PASS: /app/tree.txt is oak"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/tree.txt missing or not oak"
  echo 0 > /logs/verifier/reward.txt
fi
