#!/bin/bash
echo oak > /app/tree.txt
