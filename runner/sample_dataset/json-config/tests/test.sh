#!/bin/bash
# Reward 1 when /app/config.json parses to exactly the requested object.
mkdir -p /logs/verifier
if python3 -c '
import json, sys
data = json.load(open("/app/config.json"))
sys.exit(0 if data == {"name": "tapdeck", "port": 8300, "debug": False}
         and type(data["port"]) is int else 1)
' 2>/dev/null; then
  echo "PASS: config.json is correct"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/config.json missing, invalid or wrong"
  echo 0 > /logs/verifier/reward.txt
fi
