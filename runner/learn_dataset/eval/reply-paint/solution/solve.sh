#!/bin/bash
echo green > /app/paint.txt
