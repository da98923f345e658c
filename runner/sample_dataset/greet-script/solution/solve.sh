#!/bin/bash
set -euo pipefail
cat > /app/greet.sh <<'SH'
#!/bin/bash
echo "Hello, $1!"
SH
chmod +x /app/greet.sh
