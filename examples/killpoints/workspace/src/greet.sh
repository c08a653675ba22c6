#!/bin/sh
# Greets the name given as $1.
echo "Hullo, $1"
