#!/bin/bash
# Reward 1 when /app/pet.txt holds exactly "dog".
mkdir -p /logs/verifier
if [ "$(cat /app/pet.txt 2>/dev/null)" = "dog" ]; then
  echo "PASS: /app/pet.txt is dog"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/pet.txt missing or not dog"
  echo 0 > /logs/verifier/reward.txt
fi
