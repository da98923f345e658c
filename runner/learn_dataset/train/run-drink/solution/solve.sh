#!/bin/bash
echo tea > /app/drink.txt
