#!/bin/bash
echo rain > /app/weather.txt
