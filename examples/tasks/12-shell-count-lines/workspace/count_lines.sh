#!/bin/sh
# Prints the total number of lines of the .txt files in the directory $1.
total=0
for f in $(ls "$1"/*.txt); do
    n=$(wc -l < $f)
    total=$((total + n))
done
echo "$total"
