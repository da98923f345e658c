#!/bin/bash
echo june > /app/month.txt
