#!/bin/sh
# Prints the numbers from 1 to $1 (bug: it stops one short).
n=1
while [ "$n" -lt "$1" ]; do echo "$n"; n=$((n + 1)); done
