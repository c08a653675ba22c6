#!/bin/sh
# Prints $1 with its final .jpeg extension changed to .jpg.
echo "$1" | sed 's/\.jpeg$/.jpg/'
