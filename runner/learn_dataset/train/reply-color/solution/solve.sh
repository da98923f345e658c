#!/bin/bash
echo blue > /app/color.txt
