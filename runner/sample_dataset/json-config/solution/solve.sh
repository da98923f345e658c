#!/bin/bash
set -euo pipefail
printf '{"name": "tapdeck", "port": 8300, "debug": false}\n' > /app/config.json
