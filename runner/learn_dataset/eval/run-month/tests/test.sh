#!/bin/bash
# Reward 1 when /app/month.txt holds exactly "june".
mkdir -p /logs/verifier
if [ "$(cat /app/month.txt 2>/dev/null)" = "june" ]; then
  echo "PASS: /app/month.txt is june"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/month.txt missing or not june"
  echo 0 > /logs/verifier/reward.txt
fi
