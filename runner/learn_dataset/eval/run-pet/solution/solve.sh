#!/bin/bash
echo dog > /app/pet.txt
