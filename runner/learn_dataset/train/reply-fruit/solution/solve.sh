#!/bin/bash
echo apple > /app/fruit.txt
