#!/bin/bash
echo cat > /app/animal.txt
