#!/bin/bash
# Reward 1 when /app/greet.sh is executable and greets two different names correctly.
mkdir -p /logs/verifier
if [ -x /app/greet.sh ] \
  && [ "$(/app/greet.sh Ada 2>/dev/null)" = "Hello, Ada!" ] \
  && [ "$(/app/greet.sh 'Grace Hopper' 2>/dev/null)" = "Hello, Grace Hopper!" ]; then
  echo "PASS: greet.sh works"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/greet.sh missing, not executable or wrong output"
  echo 0 > /logs/verifier/reward.txt
fi
