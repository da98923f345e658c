#!/bin/bash
echo pear > /app/snack.txt
