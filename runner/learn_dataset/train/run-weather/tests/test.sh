#!/bin/bash
# Reward 1 when /app/weather.txt holds exactly "rain".
mkdir -p /logs/verifier
if [ "$(cat /app/weather.txt 2>/dev/null)" = "rain" ]; then
  echo "PASS: /app/weather.txt is rain"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/weather.txt missing or not rain"
  echo 0 > /logs/verifier/reward.txt
fi
