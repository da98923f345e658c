#!/bin/bash
# Reward 1 when /app/hello.txt holds exactly "Hello, world!" (one trailing newline allowed).
mkdir -p /logs/verifier
if [ -f /app/hello.txt ] && [ "$(cat /app/hello.txt)" = "Hello, world!" ]; then
  echo "PASS: /app/hello.txt is correct"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/hello.txt missing or wrong"
  echo 0 > /logs/verifier/reward.txt
fi
