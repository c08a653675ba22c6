#!/bin/sh
# Prints the greeting the project is named for.
echo "Hello, World!"
