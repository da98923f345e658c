#!/bin/bash
echo north > /app/direction.txt
