#!/bin/bash
# Reward 1 when /app/animal.txt holds exactly "cat".
mkdir -p /logs/verifier
if [ "$(cat /app/animal.txt 2>/dev/null)" = "cat" ]; then
  echo "PASS: /app/animal.txt is cat"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/animal.txt missing or not cat"
  echo 0 > /logs/verifier/reward.txt
fi
