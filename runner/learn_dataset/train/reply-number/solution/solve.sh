#!/bin/bash
echo seven > /app/number.txt
